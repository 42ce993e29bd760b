"""The training loop: iterations with finite losses, exact resume, sharded update = 1 device."""

import json
import logging
import math
import os

import jax
import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file
from tensorboardX.proto import event_pb2

from ragen_jax.config import load_config_file
from ragen_jax.report.writer import read_metrics
from ragen_jax.rl import update as update_lib
from ragen_jax.trainer import Trainer, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(model_dir, workdir, **overrides):
  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.model.path = str(model_dir)
  config.workdir = str(workdir)
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


def tensorboard_texts(run_dir) -> dict[str, list[int]]:
  """Tag -> steps of the text summaries in a run's TensorBoard event files (TFRecord framing read by hand)."""
  texts = {}
  for name in os.listdir(run_dir / "tensorboard"):
    data, pos = (run_dir / "tensorboard" / name).read_bytes(), 0
    while pos < len(data):
      length = int.from_bytes(data[pos:pos + 8], "little")
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 16 + length
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == "text":
          texts.setdefault(value.tag.removesuffix("/text_summary"), []).append(event.step)  # tensorboardX adds it
  return texts


def test_training_iterations_log_checkpoint_and_export(replying_model_dir, tmp_path, caplog):
  caplog.set_level(logging.INFO)
  final = train(_config(replying_model_dir, tmp_path, **{"train.iterations": 3, "algorithm.preset": "grpo",
                                                         "diagnostics.compute_freq": 2}))
  rows = read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3]
  # the MI diagnostics ran at steps 1 and 3; step 2 logs no placeholder for them
  assert ["collapse/trajectory/mi_zscore" in r for r in rows] == [True, False, True]
  assert [r["collapse/computed"] for r in rows] == [1.0, 0.0, 1.0]
  for row in rows:
    assert all(math.isfinite(v) for v in row.values())
    assert 0.0 <= row["train/success"] <= 1.0
    phases = [row[f"time/{phase}_s"] for phase in ("rollout", "scoring", "diagnostics", "update")]
    assert all(t > 0 for t in phases) and row["time/iteration_s"] == pytest.approx(sum(phases))
  assert any(row["update/num_updates"] > 0 for row in rows), "the filter never let an update through"
  assert "val/success" in rows[1] and "val/success" not in rows[0]
  assert sorted(os.listdir(tmp_path / "checkpoints"), key=int)[-1] == "3"
  assert os.listdir(tmp_path / "tensorboard")
  assert (tmp_path / "final_model" / "model.safetensors").is_file()
  assert json.loads((tmp_path / "final_metrics.json").read_text())["train/success"] == final["train/success"]
  # What a newcomer is told at the start, and what the run leaves besides metrics
  count = sum(x.size for x in jax.tree.leaves(load_file(str(replying_model_dir / "model.safetensors"))))
  said = caplog.text
  for line in (f"model: {replying_model_dir}\n", f"; {count:,} parameters", "devices: 8 cpu in 1 process(es); mesh "
               "data=8 x fsdp=1 x tensor=1 over 8 of them", "run: 3 iterations of 2 groups x 4 sokoban episodes",
               "compiling: iteration 1"):
    assert line in said, line
  assert f"Total: {count:,}" in (tmp_path / "parameters.txt").read_text()
  report = (tmp_path / "report.md").read_text()
  assert "| val/success | 2 |" in report and "![" in report and "`transcripts.jsonl`" in report
  image = np.asarray(Image.open(tmp_path / "report.png").convert("L"), np.float32)
  assert image.shape[0] > 300 and image.std() > 10
  transcripts = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
  assert [(r["step"], r["seed"]) for r in transcripts] == [(step, 123 + i) for step in (2, 3) for i in range(4)]
  assert tensorboard_texts(tmp_path) == {f"transcripts/{i}": [2, 3] for i in range(4)}


def test_resume_reproduces_the_uninterrupted_run(replying_model_dir, tmp_path):
  straight = Trainer.create(_config(replying_model_dir, tmp_path / "a", **{"train.val_every": 0}))
  straight.run(2)
  phases = (update_lib.score, update_lib.diagnose, update_lib.learn)
  compiled = [phase._cache_size() for phase in phases]
  interrupted_cfg = _config(replying_model_dir, tmp_path / "b", **{"train.val_every": 0})
  first = Trainer.create(interrupted_cfg)
  first.run(1)
  first.checkpointer.close()
  resumed = Trainer.create(interrupted_cfg)
  assert resumed.try_resume() and resumed.iteration == 1
  resumed.run(2)
  assert [phase._cache_size() for phase in phases] == compiled  # one trace and compile per process
  a, b = read_metrics(str(tmp_path / "a"))[-1], read_metrics(str(tmp_path / "b"))[-1]
  assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
      k: v for k, v in b.items() if not k.startswith("time/")}
  for x, y in zip(jax.tree.leaves(straight.state.policy), jax.tree.leaves(resumed.state.policy)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_broken_latest_checkpoint_falls_back_to_the_previous(replying_model_dir, tmp_path):
  config = _config(replying_model_dir, tmp_path)
  trainer = Trainer.create(config)
  assert trainer.last_validation is None
  final = trainer.run(2)
  trainer.checkpointer.close()
  assert final["val/success"] == pytest.approx(np.mean(np.asarray(trainer.last_validation.success, np.float64)))
  # the transcripts are the validation episodes, turn by turn, with the actions the environment stepped
  val = jax.device_get(trainer.last_validation)
  transcripts = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
  assert len(transcripts) == 4
  for i, record in enumerate(transcripts):
    text = record["system"] + "".join(turn["prompt"] + turn["reply"] for turn in record["turns"])
    assert text == trainer.exp.tokenizer.decode(val.tokens[i][val.valid[i]].tolist())
    assert [t["reward"] for t in record["turns"]] == pytest.approx(val.turn_rewards[i, :val.num_turns[i]].tolist())
    assert [t["format_ok"] for t in record["turns"]] == val.format_ok[i, :val.num_turns[i]].tolist()
    # stepped: every recognised action (2 a turn at most, 4 in all within the budget of 10) unless one ends it
    assert sum(len(t["actions"]) for t in record["turns"]) == val.num_actions[i]
  assert any(t["actions"] == ["Up", "Left"] for r in transcripts for t in r["turns"])  # the model's usual REPLY
  np.testing.assert_array_equal(np.asarray(trainer.validation_rollout().tokens),  # fixed seeds and key
                                np.asarray(trainer.last_validation.tokens))
  for root, _, files in os.walk(tmp_path / "checkpoints" / "2"):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  resumed = Trainer.create(config)
  assert resumed.try_resume() and resumed.iteration == 1


# The collapse diagnostics run sharded in one of the two (their numbers: tests/diagnostics/test_cross_scoring.py).
@pytest.mark.parametrize("preset,diagnostics", [("ppo", True), ("grpo", False)])
def test_sharded_update_equals_single_device(replying_model_dir, tmp_path, preset, diagnostics):
  results = []
  for shape in ((1, 1, 1), (2, 2, 2)):
    config = _config(replying_model_dir, tmp_path / str(shape), **{"algorithm.preset": preset,
                                                                   "filter.enabled": False,
                                                                   "diagnostics.enabled": diagnostics})
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    config.mesh.num_devices = int(np.prod(shape))
    trainer = Trainer.create(config)
    assert trainer.exp.mesh.size == np.prod(shape)
    shardings = jax.tree.map(lambda x: x.sharding, trainer.state)
    metrics = trainer.train_iteration()
    # the jitted phases give the state back in the layout it came in (what donation and the next step need)
    assert all(jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), trainer.state,
                                            shardings)))
    results.append((metrics, jax.device_get(trainer.state.policy)))
  (m1, p1), (m8, p8) = results
  assert m1["train/score"] == m8["train/score"]
  for key in ("update/pg_loss", "update/grad_norm", "update/policy_entropy"):
    np.testing.assert_allclose(m1[key], m8[key], rtol=2e-4, atol=1e-6, err_msg=key)
  # Adam's first step is about lr * sign(grad): float noise in a near-zero gradient moves a weight by up
  # to 2 * lr (1e-3 here), so the bound is a tenth of one step.
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_training_with_a_limited_context_window(replying_model_dir, tmp_path):
  config = _config(replying_model_dir, tmp_path, **{"rollout.context_window_mode": "single_turn"})
  trainer = Trainer.create(config)
  traj = trainer.exp.source.run(trainer.state.policy, np.arange(8), np.repeat(np.arange(2), 4), jax.random.PRNGKey(0))
  later_turns = np.asarray(traj.valid) & (np.asarray(traj.turn_of_token) > 0)
  assert later_turns.any() and (np.asarray(traj.visible_from)[later_turns] > 1).all()
  metrics = trainer.train_iteration()
  assert all(math.isfinite(v) for v in metrics.values())
