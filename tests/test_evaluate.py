"""Evaluation: pass@k over the validation seeds from a rollout source alone (no optimizer, critic or checkpoints)."""

import json
import math
import os

import numpy as np
import pytest

from ragen_jax import evaluate
from ragen_jax.config import ConfigError, load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pass_at_k_written_out():
  successes = np.array([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
  # problem 0: 1 - C(3,2)/C(4,2) = 0.5; problem 1: 0; problem 2: 1
  assert evaluate.pass_at_k(successes, 2) == pytest.approx((0.5 + 0.0 + 1.0) / 3)
  assert evaluate.pass_at_k(successes, 1) == pytest.approx((0.25 + 0.0 + 1.0) / 3)


def test_evaluation_writes_results_and_builds_no_trainer(replying_model_dir, tmp_path, capsys, monkeypatch):
  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.model.path = str(replying_model_dir)
  config.workdir = str(tmp_path)
  config.evaluate.k = 2
  config.train.val_episodes = 4
  config.logging.progress_bar = True
  rollout_metrics = evaluate.rollout_metrics
  monkeypatch.setattr(evaluate, "rollout_metrics", lambda traj, prefix: rollout_metrics(traj, prefix) | {
      f"{prefix}/undefined": math.nan})  # a metric without a value, as on a batch with no turns
  evaluate.main(config)

  def refuse(constant):
    raise AssertionError(f"evaluation.json holds {constant}: not JSON")
  results = json.loads((tmp_path / "evaluation.json").read_text(), parse_constant=refuse)
  metrics = results["sokoban"]
  assert metrics["undefined"] is None
  assert metrics["pass@1"] == pytest.approx(metrics["success"])
  assert metrics["pass@1"] <= metrics["pass@2"] <= 1.0
  assert 0.0 <= metrics["valid_action_rate"] <= 1.0 and metrics["num_turns"] >= 1
  assert "| sokoban |" in (tmp_path / "evaluation.md").read_text()
  assert sorted(os.listdir(tmp_path)) == ["evaluation.json", "evaluation.md", "transcripts.jsonl"]  # no checkpoints
  # it says what it does, and shows an episode: the first prompt and each turn's reply with its parsed actions
  captured = capsys.readouterr()
  for line in (f"model: {replying_model_dir}\n", "sokoban: compiling the rollout, then playing 4 seeds x 2 sample(s)",
               f"sokoban: success {metrics['success']:.3f}",
               "sokoban, first episode (every prompt in transcripts.jsonl): seed 123: ",
               "--- turn 1 prompt\nTurn 1:\nState:\n", "--- turn 1 reply (actions: "):
    assert line in captured.out, line
  assert "--- system prompt" not in captured.out and "--- turn 2 prompt" not in captured.out
  assert "evaluate: 100%" in captured.err  # the progress bar over the environments
  transcripts = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
  assert [(r["env"], r["seed"]) for r in transcripts] == [("sokoban", 123), ("sokoban", 123), ("sokoban", 124),
                                                          ("sokoban", 124)]  # k = 2 samples of each seed


def test_every_environment_is_checked_before_the_first_is_evaluated():
  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.model.path = "scratch:tiny"  # never made: the settings fail first
  config.evaluate.envs = "sokoban,sokobn"
  with pytest.raises(ConfigError, match="env.name='sokobn' is not one of"):
    evaluate.main(config)
