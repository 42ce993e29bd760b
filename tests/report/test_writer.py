"""Metric files are strict JSON (non-finite values as null, never dropped), and a resumed run logs each iteration
once."""

import json
import math

import pytest

from ragen_jax.report.writer import MetricWriter, dump_json, json_ready, read_metrics


def _rows(path):
  def refuse(constant):
    raise AssertionError(f"{constant} is not JSON")
  return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_non_finite_metrics_are_written_as_null(tmp_path):
  writer = MetricWriter(str(tmp_path), tensorboard=False)
  writer.write(1, {"loss": float("nan"), "norm": float("inf"), "ok": 2.5})
  writer.close()
  assert _rows(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": None, "norm": None, "ok": 2.5}]
  assert read_metrics(str(tmp_path))[0]["loss"] is None
  assert json_ready({"a": -math.inf, "b": 1}) == {"a": None, "b": 1.0}
  with pytest.raises(ValueError):
    dump_json({"a": math.nan}, str(tmp_path / "bad.json"))


def _episode(score):
  return {"seed": 123, "score": score, "success": False, "system": "s",
          "turns": [{"prompt": "p", "reply": "r", "actions": [], "reward": score, "format_ok": False}]}


def test_rows_after_the_start_step_are_dropped(tmp_path):
  writer = MetricWriter(str(tmp_path), tensorboard=True)
  for step in (1, 2, 3):
    writer.write(step, {"x": float(step)})
    writer.write_transcripts(step, [_episode(float(step))])
  writer.close()
  resumed = MetricWriter(str(tmp_path), tensorboard=True, start_step=1)  # resumed from iteration 1: 2 and 3 redone
  for step in (2, 3):
    resumed.write(step, {"x": 10.0 * step})
    resumed.write_transcripts(step, [_episode(10.0 * step)])
  resumed.close()
  assert [(r["step"], r["x"]) for r in _rows(tmp_path / "metrics.jsonl")] == [(1, 1.0), (2, 20.0), (3, 30.0)]
  assert [(r["step"], r["score"]) for r in _rows(tmp_path / "transcripts.jsonl")] == [(1, 1.0), (2, 20.0), (3, 30.0)]
