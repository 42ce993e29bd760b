"""Cloud TPU VM lifecycle for ragen_jax: create, setup, run, logs, TensorBoard, copy-results, delete (stdlib only; `run`
checks the config with the trainer's code first).

Run from the repo root; every subcommand takes `--dry-run`, which prints the
exact commands (one per line, shell-quoted) instead of running them:

  python -m launch.tpu_vm create  my-tpu --zone=us-central2-b --accelerator-type=v4-8 [--spot | --reserved]
  python -m launch.tpu_vm status  my-tpu --zone=us-central2-b
  python -m launch.tpu_vm setup   my-tpu --zone=us-central2-b [--repo-url=URL] [--ref=REF]
  python -m launch.tpu_vm run     my-tpu --zone=us-central2-b --config=configs/NAME.py \
      --mesh-preset=v4-8 [--tensor=N] --workdir=gs://BUCKET/runs/NAME [--override=KEY=VALUE ...] \
      [--max-restarts=N] [--detach]
  python -m launch.tpu_vm logs    my-tpu --zone=us-central2-b [--follow]
  python -m launch.tpu_vm exec    my-tpu --zone=us-central2-b -- COMMAND ...
  python -m launch.tpu_vm copy-results my-tpu --zone=us-central2-b --run-dir=logs --dest=gs://BUCKET/x
  python -m launch.tpu_vm delete  my-tpu --zone=us-central2-b
  python -m launch.tpu_vm tensorboard --logdir=gs://BUCKET/runs/NAME [--port=6006]

The queued resource and its TPU node share the name. Remote paths are
relative to the login user's home directory on each worker. `run` checks the
config and every override here, as the trainer does, before it sends anything,
and restarts the trainer on each worker while it exits with
ragen_jax.preemption.PREEMPTED_EXIT_CODE (preempted after a checkpoint).
"""

from __future__ import annotations

import argparse
import os
import posixpath
import re
import shlex
import sys
import tempfile
from collections.abc import Sequence

from launch import commands, mesh_presets

LOG_FILE = "logs/train.log"
PID_FILE = "logs/train.pid"
REMOTE_ARCHIVE = "ragen_jax-src.tar.gz"
REQUIREMENTS = "launch/requirements-tpu.txt"


# ---------------------------------------------------------------- checked flag values

def tpu_name(value: str) -> str:
  if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", value):
    raise argparse.ArgumentTypeError(f"{value!r}: a TPU name is 1-63 lowercase letters, digits or '-', "
                                     "starting with a letter and not ending with '-'")
  return value


def zone(value: str) -> str:
  if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-[a-z]", value):
    raise argparse.ArgumentTypeError(f"{value!r}: expected a zone like us-central2-b")
  return value


def project(value: str) -> str:
  if not re.fullmatch(r"([a-z][-a-z0-9.]*:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", value):
    raise argparse.ArgumentTypeError(f"{value!r}: expected a project ID like my-project-123")
  return value


def accelerator_type(value: str) -> str:
  """`GENERATION-SIZE` as gcloud spells it: v4-8, v5litepod-16, v5p-64, v6e-8, ..."""
  generation, _, size = value.partition("-")
  if generation == "v5e":
    raise argparse.ArgumentTypeError(f"{value!r}: gcloud calls v5e 'v5litepod'; use v5litepod-{size or 'N'}")
  if generation not in mesh_presets.RUNTIME_VERSIONS or not size.isdigit() or int(size) < 1:
    raise argparse.ArgumentTypeError(f"{value!r}: expected GENERATION-SIZE with GENERATION one of "
                                     f"{', '.join(mesh_presets.RUNTIME_VERSIONS)} (e.g. v4-8, v5litepod-16, v5p-64)")
  return value


def remote_dir(value: str) -> str:
  if not commands.operand(value) or value.startswith("~"):
    raise argparse.ArgumentTypeError(f"{value!r}: give a path relative to the home directory (no '~') "
                                     "or an absolute path")
  return value


def worker(value: str) -> str:
  if value != "all" and not value.isdigit():
    raise argparse.ArgumentTypeError(f"{value!r}: expected 'all' or a worker index (0, 1, ...)")
  return value


def line_count(value: str) -> int:
  if not value.isdigit():
    raise argparse.ArgumentTypeError(f"{value!r}: expected a number of lines")
  return int(value)


def python_name(value: str) -> str:
  if not re.fullmatch(r"python3\.[0-9]+", value) or int(value.split(".")[1]) < 11:
    raise argparse.ArgumentTypeError(f"{value!r}: expected an apt-installable interpreter name, "
                                     "python3.11 or newer (jax 0.10.2 needs Python >= 3.11)")
  return value


# ---------------------------------------------------------------- gcloud commands

def _project(args) -> list[str]:
  return [f"--project={args.project}"] if args.project else []


def _ssh(args, remote_command: str, on: str = "all") -> list[str]:
  """`gcloud ... tpu-vm ssh NAME --worker=ON --command=...`: one shell command on workers `on`."""
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.name, f"--zone={args.zone}", f"--worker={on}",
          *_project(args), f"--command={remote_command}"]


def _shell(*steps: Sequence[str] | str) -> str:
  """Joins steps with `&&`; an argv step is shell-quoted, a string step is used as written."""
  return " && ".join(step if isinstance(step, str) else shlex.join(step) for step in steps)


def local_archive(name: str) -> str:
  """Where `setup` packs the local checkout before copying it."""
  return os.path.join(tempfile.gettempdir(), f"ragen_jax-{name}.tar.gz")


def create_plan(args) -> list[list[str]]:
  runtime = args.runtime_version or mesh_presets.RUNTIME_VERSIONS[args.accelerator_type.partition("-")[0]]
  return [["gcloud", "compute", "tpus", "queued-resources", "create", args.name, f"--node-id={args.name}",
           f"--zone={args.zone}", f"--accelerator-type={args.accelerator_type}", f"--runtime-version={runtime}",
           *_project(args), *(["--spot"] if args.spot else []), *(["--reserved"] if args.reserved else []),
           *([f"--service-account={args.service_account}"] if args.service_account else [])]]


def status_plan(args) -> list[list[str]]:
  return [["gcloud", "compute", "tpus", "queued-resources", "describe", args.name, f"--zone={args.zone}",
           *_project(args)]]


def setup_plan(args) -> list[list[str]]:
  """Interpreter and make on every worker, the code (copied or cloned), then the venv with the TPU extra."""
  py, home = args.python, args.remote_dir
  tools = (f"command -v {py} >/dev/null && command -v make >/dev/null || "
           f"(sudo apt-get update -qq && sudo env DEBIAN_FRONTEND=noninteractive "
           f"apt-get install -y -qq {py} {py}-venv make)")
  if args.repo_url:
    code = [_ssh(args, _shell(f"(test -d {shlex.quote(posixpath.join(home, '.git'))} || "
                              f"{shlex.join(['git', 'clone', '--quiet', args.repo_url, home])})",
                              ["git", "-C", home, "fetch", "--quiet", "origin", args.ref],
                              ["git", "-C", home, "checkout", "--quiet", "--detach", "FETCH_HEAD"]))]
  else:
    archive = local_archive(args.name)
    code = [["git", "-C", str(commands.ROOT), "archive", "--format=tar.gz", f"--output={archive}", args.ref],
            ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive, f"{args.name}:{REMOTE_ARCHIVE}",
             f"--zone={args.zone}", "--worker=all", *_project(args)],
            _ssh(args, _shell(["mkdir", "-p", home], ["tar", "-xzf", REMOTE_ARCHIVE, "-C", home],
                              ["rm", REMOTE_ARCHIVE]))]
  install = _shell(["cd", home], ["make", "install", f"PY={py}"],
                   [".venv/bin/pip", "install", "--quiet", "--disable-pip-version-check", "-r", REQUIREMENTS])
  return [_ssh(args, tools), *code, _ssh(args, install)]


def run_plan(args) -> list[list[str]]:
  """The trainer on every worker with jax.distributed on, restarted while preempted, logging to LOG_FILE
  (streamed unless --detach; detached, PID_FILE holds the id of the loop's process group). The flags are
  checked here first."""
  if args.tensor > 1 and not args.mesh_preset:
    raise ValueError("--tensor needs --mesh-preset (or set mesh.* with --override)")
  settings = commands.merge_settings(
      [("distributed.enabled", "True")],
      mesh_presets.mesh_settings(args.mesh_preset, args.tensor).items() if args.mesh_preset else [],
      [("workdir", args.workdir)],
      args.override)
  commands.check_train_flags(args.config, settings, paths_on_workers=True)
  train = commands.with_env(args.env, commands.train_argv(".venv/bin/python", args.config, settings))
  loop = shlex.join(["sh", "-c", commands.restart_loop(train, args.max_restarts)])
  if args.detach:
    launch = f"{{ setsid nohup {loop} >> {LOG_FILE} 2>&1 < /dev/null & echo $! > {PID_FILE}; }}"
  else:
    launch = f"set -o pipefail && {loop} 2>&1 | tee -a {LOG_FILE}"
  return [_ssh(args, _shell(["cd", args.remote_dir], ["mkdir", "-p", "logs"], launch))]


def exec_plan(args) -> list[list[str]]:
  return [_ssh(args, shlex.join(args.command), on=args.worker)]


def logs_plan(args) -> list[list[str]]:
  tail = ["tail", "-n", str(args.lines), *(["-F"] if args.follow else []), posixpath.join(args.remote_dir, LOG_FILE)]
  return [_ssh(args, shlex.join(tail), on=args.worker)]


def copy_results_plan(args) -> list[list[str]]:
  """Mirrors a directory on one worker (process 0 by default, which writes reports) to gs://."""
  sync = ["gcloud", "storage", "rsync", "--recursive", args.run_dir, args.dest]
  return [_ssh(args, _shell(["cd", args.remote_dir], sync), on=args.worker)]


def tensorboard_plan(args) -> list[list[str]]:
  """TensorBoard on this machine over a run directory in gs:// (needs `pip install tensorboard gcsfs`)."""
  return [["tensorboard", f"--logdir={args.logdir}", f"--port={args.port}"]]


def delete_plan(args) -> list[list[str]]:
  """Deletes the queued resource and, with --force, its TPU node."""
  return [["gcloud", "compute", "tpus", "queued-resources", "delete", args.name, f"--zone={args.zone}",
           *_project(args), "--force", "--quiet"]]


# ---------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m launch.tpu_vm", description=__doc__.split("\n\n")[0])
  common = argparse.ArgumentParser(add_help=False)
  common.add_argument("name", type=tpu_name, help="queued resource and TPU node name")
  common.add_argument("--zone", type=zone, required=True, help="e.g. us-central2-b")
  common.add_argument("--project", type=project, help="default: gcloud's configured project")
  common.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
  on_worker = argparse.ArgumentParser(add_help=False)
  on_worker.add_argument("--remote-dir", type=remote_dir, default="ragen_jax", help="checkout on each worker")
  sub = parser.add_subparsers(dest="subcommand", required=True)

  p = sub.add_parser("create", parents=[common], help="request a TPU slice (queued resource)")
  p.set_defaults(plan=create_plan)
  p.add_argument("--accelerator-type", type=accelerator_type, required=True, help="v4-8, v5litepod-16, v5p-64, ...")
  p.add_argument("--runtime-version", type=commands.operand,
                 help="default: the TPU docs' runtime for the generation")
  p.add_argument("--service-account", type=commands.operand,
                 help="e-mail of the workers' service account (needs write access to gs://)")
  tier = p.add_mutually_exclusive_group()
  tier.add_argument("--spot", action="store_true", help="Spot capacity (cheaper, preemptible)")
  tier.add_argument("--reserved", action="store_true", help="use the project's reservation")

  p = sub.add_parser("status", parents=[common], help="describe the queued resource (wait for ACTIVE)")
  p.set_defaults(plan=status_plan)

  p = sub.add_parser("setup", parents=[common, on_worker], help="code, Python and pinned packages on every worker")
  p.set_defaults(plan=setup_plan)
  p.add_argument("--repo-url", type=commands.operand,
                 help="git clone this URL on the workers instead of copying the local checkout")
  p.add_argument("--ref", type=commands.operand, default="HEAD",
                 help="commit, branch or tag to copy or check out (default HEAD; a copy takes committed files only)")
  p.add_argument("--python", type=python_name, default="python3.11", help="interpreter, apt-installed if missing")

  p = sub.add_parser("run", parents=[common, on_worker], help="train on every worker (jax.distributed)")
  p.set_defaults(plan=run_plan)
  p.add_argument("--config", type=commands.config_file, required=True, help="configs/NAME.py")
  p.add_argument("--workdir", type=commands.gcs_path, required=True,
                 help="gs:// run directory: checkpoints and reports from every host land there")
  p.add_argument("--mesh-preset", type=commands.mesh_preset, help=", ".join(mesh_presets.PRESETS))
  p.add_argument("--tensor", type=commands.positive, default=1,
                 help="tensor-parallel ways of the preset's mesh (must divide its chips; fsdp = chips / N)")
  p.add_argument("--override", type=commands.config_override, action="append", default=[], metavar="KEY=VALUE",
                 help="extra --config.KEY=VALUE (repeatable)")
  p.add_argument("--env", type=commands.env_assignment, action="append", default=[], metavar="NAME=VALUE",
                 help="environment variable for the trainer (repeatable)")
  p.add_argument("--max-restarts", type=commands.count, default=100,
                 help="restarts of a trainer preempted after a checkpoint (exit code 75) on each worker")
  p.add_argument("--detach", action="store_true",
                 help=f"run under nohup (process group id in {PID_FILE}); follow with `logs --follow`")

  p = sub.add_parser("exec", parents=[common], help="one command on the workers, output streamed")
  p.set_defaults(plan=exec_plan)
  p.add_argument("--worker", type=worker, default="all", help="'all' (default) or an index")
  p.add_argument("command", type=commands.one_line, nargs="+", help="after `--`: the command and its arguments")

  p = sub.add_parser("logs", parents=[common, on_worker], help=f"show {LOG_FILE} of a worker")
  p.set_defaults(plan=logs_plan)
  p.add_argument("--worker", type=worker, default="0", help="index (default 0, the reporting process) or 'all'")
  p.add_argument("--lines", type=line_count, default=100)
  p.add_argument("--follow", action="store_true", help="keep streaming new lines (Ctrl-C to stop)")

  p = sub.add_parser("copy-results", parents=[common, on_worker], help="rsync a worker directory to gs://")
  p.set_defaults(plan=copy_results_plan)
  p.add_argument("--run-dir", type=commands.operand, required=True,
                 help="directory on the worker, relative to --remote-dir")
  p.add_argument("--dest", type=commands.gcs_path, required=True, help="gs://BUCKET/PATH")
  p.add_argument("--worker", type=worker, default="0", help="index (default 0, the reporting process)")

  p = sub.add_parser("delete", parents=[common], help="delete the queued resource and its TPU VMs")
  p.set_defaults(plan=delete_plan)

  p = sub.add_parser("tensorboard", help="TensorBoard here over a gs:// run directory")
  p.set_defaults(plan=tensorboard_plan)
  p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
  p.add_argument("--logdir", type=commands.gcs_path, required=True, help="gs://BUCKET/runs/NAME (or a parent)")
  p.add_argument("--port", type=commands.positive, default=6006)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  return commands.main(build_parser(), argv)


if __name__ == "__main__":
  sys.exit(main())
