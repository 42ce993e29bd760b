"""Config files (`get_config()` under configs/) and `--config.a.b=value` overrides.

Entry points call `run(main)`: before anything is compiled, a missing config file
or an override of a key the config does not have fails with the key's name and the
closest real keys. Wrong types are rejected by ml_collections with the flag's name,
and a value the section dataclasses reject (`ConfigError`), or any other `UserError`
(a run halted on non-finite updates, checkpoints that do not restore), ends the run
with its one-line message.

`--config.env.params.NAME=VALUE` sets any parameter of the chosen environment, none
of which the config file needs to list: the value is kept as text here and typed by
the environment's own parameter types when it is built (`parse_text`).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
import types
import typing
from collections.abc import Callable, Iterable

import ml_collections
from absl import app, flags
from ml_collections import config_flags

from ragen_jax import host_memory

CONFIG_HELP = "Path to a config file with get_config()."
CONFIG = config_flags.DEFINE_config_file("config", None, CONFIG_HELP)


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


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
  """"; did you mean 'a' or 'b'?" for the closest of `known` to `name` (difflib ratio >= `cutoff`), or ""."""
  close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=cutoff)
  return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def check_workdir(path: str, key: str = "workdir") -> None:
  """Raises ConfigError when a local `path`, or the nearest part of it that exists, is not a directory."""
  if "://" in path:
    return
  existing = os.path.abspath(os.path.expanduser(path))
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ConfigError(f"{key}={path!r}: {existing} is a file, not a directory; choose another {key}")


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """Calls `get_config()` of the Python file at `path` (optionally `path:arg`)."""
  path, _, arg = path.partition(":")
  if not os.path.isfile(path):
    raise ConfigError(f"--config={path}: no such config file" + did_you_mean(path, _nearby_configs(path), cutoff=0.85))
  spec = importlib.util.spec_from_file_location("_ragen_jax_config", path)
  if spec is None:
    raise ConfigError(f"--config={path}: not a Python config file (configs/NAME.py)")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError(f"--config={path}: the file defines no get_config()")
  return module.get_config(arg) if arg else module.get_config()


def _nearby_configs(path: str) -> list[str]:
  """The .py files beside where `path` points (what a misspelt config file name may have meant)."""
  folder = os.path.dirname(path) or "."
  if not os.path.isdir(folder):
    return []
  return [os.path.join(os.path.dirname(path), name) for name in os.listdir(folder)
          if name.endswith(".py") and not name.startswith("_")]


def parse_text(key: str, text: str, hint):
  """`text` (a command-line value) as the type `hint` says: int, float, bool, str, `X | None` ("none"), or a
  tuple of those ("7,7" or "(7, 7)"). Raises ConfigError naming `key` when it does not parse."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
    if text.strip().lower() in ("none", "null"):
      return None
    return parse_text(key, text, next(a for a in args if a is not type(None)))
  if origin is tuple:
    parts = [p.strip() for p in text.strip().strip("()[]").split(",") if p.strip()]
    element_hints = [args[0]] * len(parts) if len(args) == 2 and args[1] is Ellipsis else list(args)
    if len(parts) != len(element_hints):
      raise ConfigError(f"{key}={text!r}: needs {len(element_hints)} comma-separated values")
    return tuple(parse_text(key, p, h) for p, h in zip(parts, element_hints))
  if hint is bool:
    if text.strip().lower() not in ("true", "false", "1", "0"):
      raise ConfigError(f"{key}={text!r}: must be true or false")
    return text.strip().lower() in ("true", "1")
  if hint in (int, float, str):
    try:
      return hint(text.strip()) if hint is not str else text
    except ValueError:
      raise ConfigError(f"{key}={text!r}: must be {'an int' if hint is int else 'a number'}") from None
  raise ConfigError(f"{key} holds a {getattr(hint, '__name__', hint)} and cannot be set from the command line")


def all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  """Every dotted key of a (nested) ConfigDict."""
  keys = []
  for name, value in config.items():
    keys.append(prefix + name)
    if isinstance(value, ml_collections.ConfigDict):
      keys.extend(all_keys(value, prefix + name + "."))
  return keys


HELP_FLAGS = ("help", "h", "helpshort", "helpfull", "helpxml")
ENV_PARAMS = "env.params"  # any key below it may be overridden: the environment checks and types them


def check_override_keys(config: ml_collections.ConfigDict, keys: Iterable[str]) -> None:
  """Raises ConfigError naming every override key the config lacks (keys below `env.params` excepted)."""
  known = set(all_keys(config))
  for key in keys:
    if key not in known and not (ENV_PARAMS in known and key.startswith(ENV_PARAMS + ".")):
      raise ConfigError(f"unknown config key {key!r}{did_you_mean(key, known)}")


def _override_keys(argv: list[str], flag: str = "config") -> tuple[str | None, list[str]]:
  """(the config file of `--config=PATH` or `--config PATH`, the keys of every `--config.KEY=VALUE`)."""
  path, keys = None, []
  for i, arg in enumerate(argv[1:], 1):
    name, sep, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and name == flag:
      path = value if sep else (argv[i + 1] if i + 1 < len(argv) else None)
    elif arg.startswith("-") and name.startswith(flag + "."):
      keys.append(name[len(flag) + 1:])
  return path, keys


def _take_env_params(argv: list[str], flag: str = "config") -> tuple[list[str], dict[str, str]]:
  """(argv without its `--config.env.params.NAME=VALUE` or `--config.env.params.NAME VALUE` flags,
  {NAME: VALUE})."""
  prefix, rest, params = f"{flag}.{ENV_PARAMS}.", [], {}
  args = iter(argv)
  for arg in args:
    name, sep, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and name.startswith(prefix):
      params[name[len(prefix):]] = value if sep else next(args, "")
    else:
      rest.append(arg)
  return rest, params


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """absl flags parser that names a missing config file or misspelt config keys instead of a traceback, and
  passes `--config.env.params.*` to the config's `env.params` as text. `flag_values` holds the `config` flag."""
  path, keys = _override_keys(argv)
  if path is None:
    if any(arg.lstrip("-") in HELP_FLAGS for arg in argv[1:]):
      return flag_values(argv)
    sys.exit("error: --config=configs/NAME.py is required (a file with get_config())")
  try:
    config = load_config_file(path)
    check_override_keys(config, keys)
  except ConfigError as e:
    sys.exit(f"error: {e}")
  has_env_params = ENV_PARAMS in all_keys(config)
  argv, env_params = _take_env_params(argv) if has_env_params else (argv, {})
  sys.argv = argv  # ml_collections finds the override flags it defines in sys.argv
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    sys.exit(f"error: {e}")
  if env_params:
    env = flag_values["config"].value.env
    env.params = ml_collections.ConfigDict({**env.params.to_dict(), **env_params})
  return rest


def parse_config(argv: list[str]) -> ml_collections.ConfigDict:
  """The config an entry point started with `argv` (`[program, --config=FILE, --config.KEY=VALUE, ...]`) runs:
  `parse_flags` into fresh flags, so it can run more than once in a process (the launchers check a job's flags
  with it before they start it). A mistake exits with the entry points' one-line `error: ...`."""
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, CONFIG_HELP, flag_values=values)
  process_argv = sys.argv
  try:
    parse_flags(argv, values)
  finally:
    sys.argv = process_argv
  return values["config"].value


def run(main: Callable[[ml_collections.ConfigDict], None], default_config: str | None = None) -> None:
  """absl `app.run` for an entry point whose `main` takes the parsed config; on the CPU, with glibc set to reuse
  freed memory first (`host_memory.reuse_freed_memory`)."""
  host_memory.reuse_freed_memory()
  if default_config and not any(a.startswith(("--config=", "-config=")) or a in ("--config", "-config")
                                for a in sys.argv[1:]):
    sys.argv.insert(1, f"--config={default_config}")
  def run_main(_):
    try:
      main(CONFIG.value)
    except UserError as e:
      sys.exit(f"error: {e}")

  app.run(run_main, flags_parser=parse_flags)
