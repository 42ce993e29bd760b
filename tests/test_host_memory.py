"""On the CPU, the entry points set glibc to reuse freed memory: a program's temporaries stop page-faulting."""

import os
import subprocess
import sys

import pytest

from ragen_jax import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A program whose temporaries hold a 65536 x 512 float32 activation (128 MiB, 32,768 pages) that a dot then reads,
# started as an entry point (`config.run`, after the entry points' imports) or called directly. A reused heap still
# grows now and then (a call that finds no free block large enough faults in a new one), hence the median call.
PROGRAM = """
import resource, sys
import ragen_jax.train
from ragen_jax import config as config_lib

def main(_):
  import jax, jax.numpy as jnp
  f = jax.jit(lambda x_NK, w_KM: jnp.tanh(x_NK @ w_KM).T @ x_NK)
  x, w = jnp.ones((65536, 64)) / 64, jnp.ones((64, 512)) / 64
  faults = []
  for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(f(x, w))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  print(sorted(faults[1:])[4])  # the median call's page faults after the first

if sys.argv.pop(1) == "entry_point":
  config_lib.run(main, default_config="configs/tiny_test.py")
else:
  main(None)
"""


def _median_page_faults_of_a_call(start: str) -> int:
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  result = subprocess.run([sys.executable, "-c", PROGRAM, start], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
  return int(result.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_temporaries_are_reused_instead_of_faulted_in_again():
  pages = 65536 * 512 * 4 // 4096
  assert _median_page_faults_of_a_call("direct") > pages / 2  # glibc's default: a fresh map each call
  assert _median_page_faults_of_a_call("entry_point") < pages / 20


@pytest.mark.parametrize("platforms,cpu_only", [("cpu", True), (" cpu ", True), ("tpu", False), ("cpu,cuda", False)])
def test_only_a_cpu_only_process_is_set(monkeypatch, platforms, cpu_only):
  monkeypatch.setenv("JAX_PLATFORMS", platforms)
  assert host_memory._cpu_only() is cpu_only  # pylint: disable=protected-access
