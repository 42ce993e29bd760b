"""This machine's limits, measured in the same run as every benchmark: matmul peak and memory bandwidth.

  .venv/bin/python bench/limits.py

A decode step's roofline is the larger of two times: the bytes it must read (the weights and the KV cache)
over the bandwidth, and its FLOPs over the matmul peak (`Limits.decode_step`, which also says which binds).
"""

from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench.common import report, timed  # noqa: E402

MATMUL_SIZES = (512, 1024, 2048)
GPU_MATMUL_SIZES = (2048, 4096, 8192)  # a GPU reaches its peak only on larger products
STREAM_BYTES = 512 * 2**20  # far past any CPU cache (and a GPU's L2)


def matmul_flops(size: int, dtype, repeats: int = 5) -> float:
  """FLOP/s of a jitted `size` x `size` matmul in `dtype` (best of `repeats`)."""
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  b = jax.random.normal(jax.random.key(1), (size, size), dtype)
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))
  seconds, _ = timed(matmul, a, b, repeats=repeats)
  return 2 * size**3 / seconds


def stream_bandwidth(num_bytes: int = STREAM_BYTES, repeats: int = 5) -> float:
  """Bytes/s read by a jitted sum over a float32 array of `num_bytes` (each element read once)."""
  x = jnp.ones(num_bytes // 4, jnp.float32)
  total = jax.jit(jnp.sum)
  jax.block_until_ready(total(x))
  seconds, _ = timed(total, x, repeats=repeats)
  return num_bytes / seconds


@dataclasses.dataclass(frozen=True)
class Limits:
  """The measured peaks: FLOP/s per matmul dtype (best over `MATMUL_SIZES`, on a GPU `GPU_MATMUL_SIZES`) and
  streaming bytes/s."""

  f32_flops: float
  bf16_flops: float
  bandwidth: float

  def peak(self, dtype: str) -> float:
    """The matmul FLOP/s of compute dtype `dtype` ("float32" / "f32" or "bfloat16" / "bf16")."""
    return self.f32_flops if dtype in ("f32", "float32") else self.bf16_flops

  def decode_step(self, bytes_read: float, flops: float, dtype: str = "f32") -> tuple[float, str]:
    """(seconds, "memory" | "compute"): the roofline time of a step reading `bytes_read` and doing `flops`."""
    memory, compute = bytes_read / self.bandwidth, flops / self.peak(dtype)
    return max(memory, compute), "memory" if memory >= compute else "compute"


def measure(verbose: bool = True) -> Limits:
  """Measures and (with `verbose`) prints every limit."""
  peaks = {}
  sizes = GPU_MATMUL_SIZES if jax.devices()[0].platform == "gpu" else MATMUL_SIZES
  for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
    for size in sizes:
      flops = matmul_flops(size, dtype)
      peaks[name] = max(peaks.get(name, 0.0), flops)
      if verbose:
        report(f"jitted {name} matmul {size}x{size}", flops / 1e9, "GFLOP/s")
  limits = Limits(peaks["f32"], peaks["bf16"], stream_bandwidth())
  if verbose:
    report(f"streaming read ({STREAM_BYTES >> 20} MiB f32 sum)", limits.bandwidth / 1e9, "GB/s")
  return limits


if __name__ == "__main__":
  print(f"{jax.device_count()} {jax.devices()[0].platform} device(s), {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f}")
  measure()
