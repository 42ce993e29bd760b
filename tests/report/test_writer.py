"""Metric files are strict JSON (non-finite values as null, never dropped), a resumed run logs each iteration
once (JSONL and TensorBoard), and the config is recorded with the metrics."""

import json
import math
import os

import pytest
from tensorboardX.proto import event_pb2, plugin_hparams_pb2

from ragen_jax.report.writer import MetricWriter, dump_json, json_ready, read_metrics, wandb_run_id


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


def tensorboard_events(log_dir) -> list:
  """The events of the TensorBoard event files in `log_dir`, oldest file first (TFRecord framing read by hand)."""
  events = []
  for name in sorted(os.listdir(log_dir)):  # events.out.tfevents.<time>...
    data, pos = (log_dir / name).read_bytes(), 0
    while pos < len(data):
      length = int.from_bytes(data[pos:pos + 8], "little")
      events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]))
      pos += 16 + length
  return events


def tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
  """Tag -> (step, value) of the scalars as TensorBoard shows them: a session start at step s (a writer's
  `purge_step`) drops the points at s and after that earlier files wrote."""
  scalars = {}
  for event in tensorboard_events(log_dir):
    if event.session_log.status == event.session_log.START:
      scalars = {tag: [p for p in points if p[0] < event.step] for tag, points in scalars.items()}
    for value in event.summary.value:
      if value.HasField("simple_value"):
        scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
  return scalars


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
  assert tensorboard_scalars(tmp_path / "tensorboard") == {"x": [(1, 1.0), (2, 20.0), (3, 30.0)]}


def test_the_config_is_written_logged_as_hparams_and_the_wandb_id_kept(tmp_path):
  config = {"seed": 0, "train": {"actor_lr": 1e-6, "profile_steps": (2, 3), "resume": True}}
  MetricWriter(str(tmp_path), tensorboard=True, config=config).close()
  assert json.loads((tmp_path / "config.json").read_text()) == config | {"train": config["train"] | {
      "profile_steps": [2, 3]}}
  starts = [plugin_hparams_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content).session_start_info
            for event in tensorboard_events(tmp_path / "tensorboard") for v in event.summary.value
            if v.tag == "_hparams_/session_start_info"]
  assert [{k: getattr(v, v.WhichOneof("kind")) for k, v in s.hparams.items()} for s in starts] == [
      {"seed": 0.0, "train.actor_lr": 1e-6, "train.profile_steps": "(2, 3)", "train.resume": True}]
  # W&B (not installed here) gets the same run id on every start in a workdir, so a resumed run continues it
  run_id = wandb_run_id(str(tmp_path))
  assert run_id == wandb_run_id(str(tmp_path)) != wandb_run_id(str(tmp_path / "other"))
