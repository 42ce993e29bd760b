"""On the CPU, the entry points set glibc to reuse freed memory: a freed block is not page-faulted in again."""

import os
import subprocess
import sys

import pytest

from ragen_jax import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A worker thread (as XLA:CPU's, which allocate each call's temporaries) allocates, fills and frees a 128 MiB block
# 5 times, in a program started as an entry point (`config.run`, after the entry points' imports) or not.
PROGRAM = """
import ctypes, ctypes.util, resource, sys, threading
import ragen_jax.train
from ragen_jax import config as config_lib
SIZE = 128 << 20

def main(_):
  libc = ctypes.CDLL(ctypes.util.find_library("c"))
  libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
  libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
  faults = []

  def worker():
    for _ in range(5):
      before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
      block = libc.malloc(SIZE)
      libc.memset(block, 1, SIZE)
      libc.free(block)
      faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

  thread = threading.Thread(target=worker)
  thread.start()
  thread.join()
  print(*faults)

if sys.argv.pop(1) == "entry_point":
  config_lib.run(main, default_config="configs/tiny_test.py")
else:
  main(None)
"""


def _page_faults_of_each_block(start: str) -> list[int]:
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", PROGRAM, start], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
  return [int(n) for n in result.stdout.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_freed_block_is_reused_instead_of_faulted_in_again():
  pages = (128 << 20) // 4096
  assert min(_page_faults_of_each_block("direct")) > pages / 2  # glibc's default: a fresh map each time
  first, *later = _page_faults_of_each_block("entry_point")
  assert first > pages / 2 and max(later) < pages / 20


@pytest.mark.parametrize("platforms,cpu_only", [("cpu", True), (" cpu ", True), ("tpu", False), ("cpu,cuda", False)])
def test_only_a_cpu_only_process_is_set(monkeypatch, platforms, cpu_only):
  monkeypatch.setenv("JAX_PLATFORMS", platforms)
  assert host_memory._cpu_only() is cpu_only  # pylint: disable=protected-access
