"""Evaluation: pass@k against brute-force enumeration, and an end-to-end run."""

import itertools
import json
import os

import numpy as np
import pytest

from ragen_jax import evaluate
from ragen_jax.config import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("n,k", [(4, 1), (4, 2), (5, 3), (6, 6)])
def test_pass_at_k_equals_enumeration_over_subsets(n, k):
  rng = np.random.default_rng(n * 10 + k)
  successes = rng.random((7, n)) < 0.4
  brute = np.mean([np.mean([row[list(c)].any() for c in itertools.combinations(range(n), k)]) for row in successes])
  assert evaluate.pass_at_k(successes, k) == pytest.approx(brute, abs=1e-12)
  with pytest.raises(ValueError, match="pass@"):
    evaluate.pass_at_k(successes, n + 1)


def test_evaluate_writes_json_and_table(replying_model_dir, tmp_path):
  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.model.path = str(replying_model_dir)
  config.workdir = str(tmp_path)
  config.evaluate.envs = "sokoban"
  config.evaluate.k = 2
  evaluate.main(config)
  results = json.loads((tmp_path / "evaluation.json").read_text())["sokoban"]
  assert 0.0 <= results["pass@1"] <= results["pass@2"] <= 1.0
  assert results["pass@1"] == pytest.approx(results["success"])
  assert 0.0 < results["valid_action_rate"] <= 1.0
  assert "| sokoban |" in (tmp_path / "evaluation.md").read_text()
