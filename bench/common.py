"""Shared benchmark helpers: timing and the report line (the machine's limits are in `bench/limits.py`)."""

from __future__ import annotations

import time

import jax


def timed(fn, *args, repeats: int = 1):
  """(best seconds over `repeats`, last result) of fn(*args), blocking on JAX results."""
  best, out = float("inf"), None
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best, out


def report(name: str, value: float, unit: str, baseline_name: str | None = None, baseline: float | None = None):
  line = f"{name:<48s} {value:12.1f} {unit}"
  if baseline:
    line += f"   = {value / baseline:6.2f}x {baseline_name}"
  print(line, flush=True)
