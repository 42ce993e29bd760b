"""Shared by the launch scripts: checked flag values, the trainer command line checked here as the trainer
checks it, the loop that restarts a preempted trainer, and running or printing a plan.

A plan is a list of argv lists. `--dry-run` prints each as one shell-quoted
line (`shlex.join`), so what is printed is exactly what would run.
Stdlib only, but for `check_train_flags`, which imports the trainer's config code.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence

from launch import mesh_presets
from ragen_jax.preemption import PREEMPTED_EXIT_CODE  # a stdlib-only module

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN_MODULE = "ragen_jax.train"
_CONFIG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def config_file(value: str) -> str:
  """argparse type: a config path relative to the repo root (`configs/x.py[:arg]`) that exists here."""
  path, _, _ = value.partition(":")
  if pathlib.PurePosixPath(path).is_absolute() or not path.endswith(".py"):
    raise argparse.ArgumentTypeError(f"{value!r}: expected a .py config path relative to the repo root, "
                                     "e.g. configs/NAME.py")
  if not (ROOT / path).is_file():
    raise argparse.ArgumentTypeError(f"{value!r}: no such config file under {ROOT}")
  return value


def one_line(value: str) -> str:
  """argparse type: any string without line breaks (commands are printed and sent one per line)."""
  if "\n" in value or "\r" in value:
    raise argparse.ArgumentTypeError(f"{value!r}: line breaks cannot pass through a one-line command")
  return value


def operand(value: str) -> str:
  """argparse type: a one-line, non-empty value that cannot be mistaken for an option (no leading '-')."""
  if not one_line(value) or value.startswith("-"):
    raise argparse.ArgumentTypeError(f"{value!r}: expected a non-empty value not starting with '-'")
  return value


def config_override(value: str) -> tuple[str, str]:
  """argparse type: `KEY=VALUE` with a dotted config key; the value is kept verbatim (one line)."""
  key, sep, setting = one_line(value).partition("=")
  key = key.removeprefix("--config.")
  if not sep or not _CONFIG_KEY.fullmatch(key):
    raise argparse.ArgumentTypeError(f"{value!r}: expected KEY=VALUE with a dotted config key, e.g. rl.lr=1e-6")
  return key, setting


def env_assignment(value: str) -> tuple[str, str]:
  """argparse type: `NAME=VALUE` for an environment variable (one line)."""
  name, sep, setting = one_line(value).partition("=")
  if not sep or not _ENV_NAME.fullmatch(name):
    raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=VALUE with NAME a shell variable name")
  return name, setting


def mesh_preset(value: str) -> str:
  """argparse type: the name of a preset in launch.mesh_presets."""
  if value not in mesh_presets.PRESETS:
    raise argparse.ArgumentTypeError(mesh_presets.unknown_preset_message(value))
  return value


def count(value: str) -> int:
  """argparse type: an integer >= 0."""
  if not value.isdigit():
    raise argparse.ArgumentTypeError(f"{value!r}: expected an integer >= 0")
  return int(value)


def positive(value: str) -> int:
  """argparse type: an integer >= 1."""
  if not value.isdigit() or int(value) < 1:
    raise argparse.ArgumentTypeError(f"{value!r}: expected an integer >= 1")
  return int(value)


def gcs_path(value: str) -> str:
  """argparse type: a `gs://bucket[/path]` URL."""
  if not re.fullmatch(r"gs://[a-z0-9][-_.a-z0-9]{1,221}[a-z0-9](/.*)?", value):
    raise argparse.ArgumentTypeError(f"{value!r}: expected gs://BUCKET[/PATH]")
  return value


def merge_settings(*groups: Iterable[tuple[str, str]]) -> dict[str, str]:
  """Config settings from several sources; a key set twice is an error (ValueError)."""
  merged: dict[str, str] = {}
  for group in groups:
    for key, value in group:
      if key in merged:
        raise ValueError(f"config key {key!r} is set twice ({merged[key]!r} and {value!r})")
      merged[key] = value
  return merged


def train_flags(config: str, settings: dict[str, str]) -> list[str]:
  """`--config=FILE --config.KEY=VALUE ...`."""
  return [f"--config={config}", *(f"--config.{k}={v}" for k, v in settings.items())]


def train_argv(python: str, config: str, settings: dict[str, str]) -> list[str]:
  """`python -m ragen_jax.train --config=FILE --config.KEY=VALUE ...`."""
  return [python, "-m", TRAIN_MODULE, *train_flags(config, settings)]


def check_train_flags(config: str, settings: dict[str, str], paths_on_workers: bool) -> None:
  """Parses and validates the trainer's flags here, from the repo root, as `python -m ragen_jax.train` does
  (`config.parse_config`, `trainer.read_settings`), before anything starts; a mistake exits with the trainer's
  one-line `error: ...`. With `paths_on_workers`, `model.path` and `model.adapters` name files on the workers
  (or gs://): their settings are checked, the files are not."""
  try:  # jax and the trainer: only this check needs them
    from ragen_jax import assembly, trainer
    from ragen_jax import config as config_lib
    from ragen_jax.models.scratch import SCRATCH_TINY
  except ImportError as e:
    sys.exit(f"error: checking the config needs the trainer's packages ({e}); run with .venv/bin/python "
             "after `make install`")
  with contextlib.chdir(ROOT):
    parsed = config_lib.parse_config([TRAIN_MODULE, *train_flags(config, settings)])
    try:
      if paths_on_workers:
        assembly.ModelSettings(**parsed.model.to_dict())
        parsed.model.path, parsed.model.adapters = SCRATCH_TINY, ""
      trainer.read_settings(parsed)
    except config_lib.UserError as e:
      sys.exit(f"error: {e}")


def restart_loop(argv: Sequence[str], max_restarts: int) -> str:
  """A POSIX shell loop that runs `argv` again while it exits with PREEMPTED_EXIT_CODE (a preempted trainer that
  saved a checkpoint: the next run resumes from its workdir), at most `max_restarts` times, logging each restart
  to stderr; it exits with the job's last exit code."""
  code = PREEMPTED_EXIT_CODE
  log = f'echo "$(date -u +%FT%TZ) launch: exit {code} (preempted),'
  return "; ".join([
      "restarts=0", "while true", f"do {shlex.join(argv)}", "code=$?",
      f'if [ "$code" -ne {code} ]; then exit "$code"; fi',
      f'if [ "$restarts" -ge {max_restarts} ]; then {log} no restart left" >&2; exit "$code"; fi',
      "restarts=$((restarts + 1))", f'{log} restart $restarts of {max_restarts}" >&2', "done"])


def with_env(env: Sequence[tuple[str, str]], argv: list[str]) -> list[str]:
  """`env NAME=VALUE ... argv` (just `argv` when there is no variable)."""
  return ["env", *(f"{name}={value}" for name, value in env), *argv] if env else argv


def run_plan(plan: Sequence[Sequence[str]], dry_run: bool, cwd: pathlib.Path | None = None) -> int:
  """Prints (dry run) or runs each command in order, in `cwd` if given; returns the first non-zero exit code.

  A dry run with `cwd` starts with a `cd` line, so the printed lines can be
  pasted into a shell as they are.
  """
  if dry_run:
    print("\n".join(shlex.join(argv) for argv in ([["cd", str(cwd)]] if cwd else []) + list(plan)))
    return 0
  for argv in plan:
    print(f"+ {shlex.join(argv)}", file=sys.stderr, flush=True)
    try:
      code = subprocess.run(list(argv), cwd=cwd, check=False).returncode
    except FileNotFoundError:
      print(f"error: {argv[0]!r} not found", file=sys.stderr)
      return 127
    if code:
      return code
  return 0


def main(parser, argv=None, cwd=None) -> int:
  """Parses `argv`, builds the chosen subcommand's plan (argument errors exit early) and runs it."""
  args = parser.parse_args(argv)
  try:
    plan = args.plan(args)
  except ValueError as e:
    parser.error(str(e))
  return run_plan(plan, args.dry_run, cwd=cwd)
