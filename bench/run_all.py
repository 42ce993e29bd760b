"""`make bench`: every benchmark, one after another, each printing ratios against a baseline
measured in the same run. bench/tunix_sampler.py runs from its own venv, .venv-tunix (see that file)."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCHMARKS = ("limits.py", "envs.py", "sampler.py", "tunix_sampler.py", "rollout.py", "update.py", "diagnostics.py",
              "memory.py")
PYTHONS = {"tunix_sampler.py": os.path.join(ROOT, ".venv-tunix", "bin", "python")}  # made by `make install-tunix`

if __name__ == "__main__":
  failed = []
  for name in BENCHMARKS:
    print(f"\n=== bench/{name}", flush=True)
    python = PYTHONS.get(name, sys.executable)
    if not os.path.exists(python):
      print(f"no {python}: `make install-tunix` makes it", flush=True)
      failed.append(name)
    elif subprocess.run([python, os.path.join(HERE, name)], check=False).returncode:
      failed.append(name)
  if failed:
    sys.exit(f"failed: {', '.join(failed)}")
