"""Running a plan: commands in order, in the given directory, stopping at the first failure (no real process);
the restart loop, run by `sh` around a fake job that exits with given codes."""

import subprocess

import pytest

from launch import commands
from ragen_jax.preemption import PREEMPTED_EXIT_CODE
from tests.launch.conftest import HOSTILE


def test_run_plan_stops_at_first_failure(monkeypatch, tmp_path, capsys):
  calls = []

  def fake_run(argv, cwd=None, check=False):
    calls.append((argv, cwd))
    return subprocess.CompletedProcess(argv, returncode=3 if argv[0] == "fails" else 0)

  monkeypatch.setattr(subprocess, "run", fake_run)
  plan = [["first", "a b"], ["fails"], ["never"]]
  assert commands.run_plan(plan, dry_run=False, cwd=tmp_path) == 3
  assert calls == [(["first", "a b"], tmp_path), (["fails"], tmp_path)]
  assert capsys.readouterr().err == "+ first 'a b'\n+ fails\n"


def test_run_plan_reports_a_missing_program(monkeypatch, capsys):
  def missing(argv, cwd=None, check=False):
    raise FileNotFoundError(argv[0])

  monkeypatch.setattr(subprocess, "run", missing)
  assert commands.run_plan([["gcloud", "version"]], dry_run=False) == 127
  assert "'gcloud' not found" in capsys.readouterr().err


def test_dry_run_prints_one_quoted_line_per_command(capsys):
  assert commands.run_plan([["echo", "it's; here"], ["true"]], dry_run=True, cwd="/x y") == 0
  assert capsys.readouterr().out == "cd '/x y'\necho 'it'\"'\"'s; here'\ntrue\n"


P = PREEMPTED_EXIT_CODE
# Exits with the first code of the file `codes` and drops it; prints its argument.
FAKE_JOB = 'code=$(head -n 1 codes); tail -n +2 codes > rest; mv rest codes; echo "run: $1"; exit "$code"'


def _run_loop(tmp_path, codes, max_restarts):
  """(exit code, runs of the job, restart lines) of the loop around a job exiting with `codes` in turn."""
  (tmp_path / "codes").write_text("".join(f"{code}\n" for code in codes))
  (tmp_path / "job.sh").write_text(FAKE_JOB)
  loop = commands.restart_loop(["sh", "job.sh", HOSTILE], max_restarts)
  shell = subprocess.Popen(["sh", "-c", loop], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  out, err = shell.communicate(timeout=30)
  assert set(out.splitlines()) == {f"run: {HOSTILE}"}
  return shell.returncode, len(out.splitlines()), [line.split(" ", 1)[1] for line in err.splitlines()]


@pytest.mark.parametrize("codes, max_restarts, code, runs, log", [
    ([P, P, 0], 100, 0, 3, [f"launch: exit {P} (preempted), restart 1 of 100",
                            f"launch: exit {P} (preempted), restart 2 of 100"]),
    ([P, 3, 0], 100, 3, 2, [f"launch: exit {P} (preempted), restart 1 of 100"]),
    ([1, 0], 100, 1, 1, []),
    ([0, P], 100, 0, 1, []),
    ([P, P, P, 0], 2, P, 3, [f"launch: exit {P} (preempted), restart 1 of 2", f"launch: exit {P} (preempted), "
                             "restart 2 of 2", f"launch: exit {P} (preempted), no restart left"]),
    ([P, 0], 0, P, 1, [f"launch: exit {P} (preempted), no restart left"]),
])
def test_loop_restarts_while_preempted(tmp_path, codes, max_restarts, code, runs, log):
  assert _run_loop(tmp_path, codes, max_restarts) == (code, runs, log)
