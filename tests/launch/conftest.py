"""Helpers for the launch tests: run a script's `main(argv)` with --dry-run and parse what it printed."""

import shlex
import subprocess

import pytest

# A value that breaks any unquoted use: spaces, both quotes, `;`, `$(...)`, backticks, `~`, `&&`, `|`.
HOSTILE = "it's \"quoted\"; rm -rf ~ $(id) `whoami` && echo pwned | tee x"


def shell_words(command: str) -> list[str]:
  """Words and operators (`&&`, `|`, `>>`, `;`, ...) as a POSIX shell would split `command`."""
  lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  return list(lexer)


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch):
  """Any attempt to start a process (gcloud, git, make, ...) fails the test."""
  def refuse(argv, *args, **kwargs):
    raise AssertionError(f"a launch test tried to run {argv!r}")
  monkeypatch.setattr(subprocess, "run", refuse)


def _with_dry_run(argv):
  """`--dry-run` right after the subcommand, before any `--` that ends the options."""
  return [argv[0], "--dry-run", *argv[1:]]


@pytest.fixture
def dry_run(capsys):
  """`dry_run(main, SUBCOMMAND, *argv)` -> the printed commands, each split back into its argv."""
  def run(main, *argv):
    assert main(_with_dry_run(argv)) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return [shlex.split(line) for line in captured.out.splitlines()]
  return run


@pytest.fixture
def usage_error(capsys):
  """`usage_error(main, SUBCOMMAND, *argv)` -> stderr of a run that must stop with argparse's exit code 2."""
  def run(main, *argv):
    with pytest.raises(SystemExit) as exit_info:
      main(_with_dry_run(argv))
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err
  return run
