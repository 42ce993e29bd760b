"""`make bench`: every benchmark, one after another, each printing ratios against a baseline
measured in the same run."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = ("limits.py", "envs.py", "sampler.py", "rollout.py", "update.py", "diagnostics.py", "memory.py")

if __name__ == "__main__":
  failed = []
  for name in BENCHMARKS:
    print(f"\n=== bench/{name}", flush=True)
    if subprocess.run([sys.executable, os.path.join(HERE, name)], check=False).returncode:
      failed.append(name)
  if failed:
    sys.exit(f"failed: {', '.join(failed)}")
