"""NVIDIA GPU hosts: install the CUDA extra and train on all local GPUs (stdlib only; `run` checks the config
with the trainer's code first).

Run from the repo root (the commands run there too):

  python -m launch.gpu install [--python=python3.11]
  python -m launch.gpu run --config=configs/NAME.py [--mesh-preset=gpu8 [--tensor=N]] [--gpus=0,1,2,3] \
      [--workdir=runs/NAME] [--override=KEY=VALUE ...] [--env=NAME=VALUE ...] [--max-restarts=N]

One process drives every visible GPU. `run` checks the config and every
override as the trainer does before it starts, and restarts the trainer while
it exits with ragen_jax.preemption.PREEMPTED_EXIT_CODE (preempted after a
checkpoint; it resumes from its workdir). Several hosts: start the same `run` on
each with `--coordinator=HOST:PORT --num-processes=N --process-id=I`; this
turns on jax.distributed through RAGEN_COORDINATOR / RAGEN_NUM_PROCESSES /
RAGEN_PROCESS_ID. `--dry-run` prints the exact commands instead of running them.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from launch import commands, mesh_presets

REQUIREMENTS = "launch/requirements-gpu.txt"
PYTHON = ".venv/bin/python"


def gpu_list(value: str) -> str:
  """argparse type: comma-separated distinct GPU indices, e.g. 0,1,2,3."""
  indices = value.split(",")
  if not all(i.isdigit() for i in indices) or len(set(indices)) != len(indices):
    raise argparse.ArgumentTypeError(f"{value!r}: expected distinct GPU indices like 0,1,2,3")
  return value


def coordinator(value: str) -> str:
  """argparse type: HOST:PORT of process 0."""
  host, _, port = value.rpartition(":")
  if not host or not re.fullmatch(r"[A-Za-z0-9_.\-\[\]:]+", host) or not port.isdigit() or not 0 < int(port) < 65536:
    raise argparse.ArgumentTypeError(f"{value!r}: expected HOST:PORT, e.g. 10.0.0.2:8476")
  return value


def install_plan(args) -> list[list[str]]:
  """The pinned CPU environment (`make install`), then the CUDA extra of the same jax on top."""
  return [["make", "install", f"PY={args.python}"],
          [".venv/bin/pip", "install", "--quiet", "--disable-pip-version-check", "-r", REQUIREMENTS]]


def run_plan(args) -> list[list[str]]:
  """One trainer process over the local GPUs (with --coordinator, one of several jax.distributed processes),
  restarted while preempted; the flags are checked here first."""
  multi = (args.coordinator, args.num_processes, args.process_id)
  if any(v is not None for v in multi) and not all(v is not None for v in multi):
    raise ValueError("--coordinator, --num-processes and --process-id go together")
  if args.process_id is not None and args.process_id >= args.num_processes:
    raise ValueError(f"--process-id {args.process_id} must be below --num-processes {args.num_processes}")
  if args.tensor > 1 and not args.mesh_preset:
    raise ValueError("--tensor needs --mesh-preset (or set mesh.* with --override)")
  if args.mesh_preset and args.gpus:
    expected = mesh_presets.get_preset(args.mesh_preset).devices
    total = len(args.gpus.split(",")) * (args.num_processes or 1)
    if expected != total:
      raise ValueError(f"mesh preset {args.mesh_preset!r} expects {expected} GPUs in all, "
                       f"--gpus and --num-processes give {total}")
  env = [("CUDA_VISIBLE_DEVICES", args.gpus)] if args.gpus else []
  if args.coordinator:
    env += [("RAGEN_COORDINATOR", args.coordinator), ("RAGEN_NUM_PROCESSES", str(args.num_processes)),
            ("RAGEN_PROCESS_ID", str(args.process_id))]
  settings = commands.merge_settings(
      [("distributed.enabled", "True")] if args.coordinator else [],
      mesh_presets.mesh_settings(args.mesh_preset, args.tensor).items() if args.mesh_preset else [],
      [("workdir", args.workdir)] if args.workdir else [],
      args.override)
  commands.check_train_flags(args.config, settings, paths_on_workers=False)
  train = commands.with_env(env + args.env, commands.train_argv(PYTHON, args.config, settings))
  return [["sh", "-c", commands.restart_loop(train, args.max_restarts)]]


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m launch.gpu", description=__doc__.split("\n\n")[0])
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
  sub = parser.add_subparsers(dest="subcommand", required=True)

  p = sub.add_parser("install", parents=[common], help="venv with the pinned packages and jax[cuda12]")
  p.set_defaults(plan=install_plan)
  p.add_argument("--python", type=commands.operand, default="python3", help="interpreter for the venv (Python >= 3.11)")

  p = sub.add_parser("run", parents=[common], help="train on the local GPUs")
  p.set_defaults(plan=run_plan)
  p.add_argument("--config", type=commands.config_file, required=True, help="configs/NAME.py")
  p.add_argument("--mesh-preset", type=commands.mesh_preset, help=", ".join(mesh_presets.PRESETS))
  p.add_argument("--tensor", type=commands.positive, default=1,
                 help="tensor-parallel ways of the preset's mesh (must divide its devices; fsdp = devices / N)")
  p.add_argument("--gpus", type=gpu_list, help="CUDA_VISIBLE_DEVICES, e.g. 0,1,2,3 (default: all)")
  p.add_argument("--workdir", type=commands.one_line, help="run directory: a local path or gs://BUCKET/PATH")
  p.add_argument("--override", type=commands.config_override, action="append", default=[], metavar="KEY=VALUE",
                 help="extra --config.KEY=VALUE (repeatable)")
  p.add_argument("--env", type=commands.env_assignment, action="append", default=[], metavar="NAME=VALUE",
                 help="environment variable for the trainer (repeatable)")
  p.add_argument("--max-restarts", type=commands.count, default=100,
                 help="restarts of a trainer preempted after a checkpoint (exit code 75)")
  p.add_argument("--coordinator", type=coordinator, help="HOST:PORT of process 0 (multi-host only)")
  p.add_argument("--num-processes", type=commands.positive, help="number of hosts (multi-host only)")
  p.add_argument("--process-id", type=commands.count, help="this host's index, below --num-processes")
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  return commands.main(build_parser(), argv, cwd=commands.ROOT)


if __name__ == "__main__":
  sys.exit(main())
