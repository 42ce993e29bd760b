"""Config files (`get_config()` under configs/) and `--config.a.b=value` overrides.

Entry points call `run(main)`: before anything is compiled, an override of a key
the config does not have fails with the key's name and the closest real keys.
Wrong types are rejected by ml_collections with the flag's name, and a value the
section dataclasses reject (`ConfigError`), or any other `UserError` (a run halted on non-finite updates,
checkpoints that do not restore), ends the run with its one-line message.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from collections.abc import Callable, Iterable

import ml_collections
from absl import app, flags
from ml_collections import config_flags

CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file with get_config().")


class UserError(Exception):
  """An error the user can act on: entry points print it as one line `error: ...` and exit non-zero."""


class ConfigError(UserError, ValueError):
  """A config key or value that cannot work; raised before any compilation."""


def check_one_of(key: str, value, choices: Iterable) -> None:
  """Raises ConfigError naming `key` and the allowed values unless `value` is one of `choices`."""
  choices = tuple(choices)
  if value not in choices:
    raise ConfigError(f"{key}={value!r} is not one of {', '.join(repr(c) for c in choices)}")


def check(key: str, ok: bool, requirement: str, value) -> None:
  """Raises ConfigError `key=value: requirement` unless `ok`."""
  if not ok:
    raise ConfigError(f"{key}={value!r}: {requirement}")


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """Calls `get_config()` of the Python file at `path` (optionally `path:arg`)."""
  path, _, arg = path.partition(":")
  spec = importlib.util.spec_from_file_location("_ragen_jax_config", path)
  if spec is None:
    raise ConfigError(f"config file {path!r} not found")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Every dotted key of a (nested) ConfigDict."""
  keys = []
  for name, value in config.items():
    keys.append(prefix + name)
    if isinstance(value, ml_collections.ConfigDict):
      keys.extend(all_keys(value, prefix + name + "."))
  return keys


def check_override_keys(config: ml_collections.ConfigDict, keys: Iterable[str]) -> None:
  """Raises ConfigError naming every override key the config lacks."""
  known = set(all_keys(config))
  for key in keys:
    if key not in known:
      close = difflib.get_close_matches(key, sorted(known), n=3)
      hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
      raise ConfigError(f"unknown config key {key!r}{hint}")


def _override_keys(argv: list[str], flag: str = "config") -> tuple[str | None, list[str]]:
  path, keys = None, []
  for arg in argv[1:]:
    name, _, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and name == flag:
      path = value
    elif arg.startswith("-") and name.startswith(flag + "."):
      keys.append(name[len(flag) + 1:])
  return path, keys


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags parser that names misspelt config keys instead of a traceback."""
  path, keys = _override_keys(argv)
  if path is not None:
    try:
      check_override_keys(load_config_file(path), keys)
    except ConfigError as e:
      sys.exit(f"error: {e}")
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f"error: {e}")


def run(main: Callable[[ml_collections.ConfigDict], None], default_config: str | None = None) -> None:
  """absl `app.run` for an entry point whose `main` takes the parsed config."""
  if default_config and not any(a.startswith(("--config=", "-config=")) or a in ("--config", "-config")
                                for a in sys.argv[1:]):
    sys.argv.insert(1, f"--config={default_config}")
  def run_main(_):
    try:
      main(CONFIG.value)
    except UserError as e:
      sys.exit(f"error: {e}")

  app.run(run_main, flags_parser=parse_flags)
