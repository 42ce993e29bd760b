"""The training loop: iterations with finite losses, exact resume, sharded update = 1 device."""

import json
import math
import os

import jax
import numpy as np
import pytest

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


def test_training_iterations_log_checkpoint_and_export(replying_model_dir, tmp_path):
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
