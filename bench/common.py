"""Shared benchmark helpers: timing and the matmul roofline measured in the same run."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def timed(fn, *args, repeats: int = 1):
  """(best seconds over `repeats`, last result) of fn(*args), blocking on JAX results."""
  best, out = float("inf"), None
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best, out


def matmul_peak_flops(size: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of a jitted float32 square matmul: the roofline the targets are stated against."""
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))
  seconds, _ = timed(matmul, a, b, repeats=repeats)
  return 2 * size**3 / seconds


def report(name: str, value: float, unit: str, baseline_name: str | None = None, baseline: float | None = None):
  line = f"{name:<48s} {value:12.1f} {unit}"
  if baseline:
    line += f"   = {value / baseline:6.2f}x {baseline_name}"
  print(line, flush=True)
