"""Running a plan: commands in order, in the given directory, stopping at the first failure (no real process)."""

import subprocess

from launch import commands


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
