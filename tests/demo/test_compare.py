"""`make compare`: Spearman on known input, and a shortened comparison writes every output."""

import json
import math

import numpy as np
import pytest
from matplotlib import colors
from PIL import Image
from scipy import stats

from ragen_jax.demo.compare import run
from ragen_jax.report.comparison import COLORS, SETTINGS, spearman
from tests.demo.test_demo import shortened


def test_spearman_matches_hand_computed_ranks_with_ties():
  # ranks x: 1, 2.5, 2.5, 4, 5 and y: 2, 1, 4, 3, 5 -> centred sums 6.5 / sqrt(9.5 * 10)
  assert spearman([1.0, 2.0, 2.0, 3.0, 7.0], [0.2, 0.1, 0.9, 0.5, 1.0]) == pytest.approx(6.5 / math.sqrt(95.0))
  assert spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
  assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
  assert spearman([1, 2, float("nan"), 3], [3, 2, 100, 1]) == pytest.approx(-1.0)  # the nan pair is left out
  assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1], [2]))


def test_spearman_matches_scipy_with_many_ties():
  rng = np.random.default_rng(0)
  x, y = rng.integers(0, 4, 30).astype(float), rng.integers(0, 5, 30).astype(float)
  assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def _pixels_near(image, color: str) -> int:
  rgb = np.round(255 * np.array(colors.to_rgb(color))).astype(int)
  return int(np.sum(np.all(np.abs(image.astype(int) - rgb) < 20, axis=-1)))


def test_shortened_compare_writes_every_output(tmp_path):
  config = shortened("compare", tmp_path)
  config.compare.seeds = 2
  config.train.checkpoint_every = 0
  results = run(config)

  for path in ("sft_model/model.safetensors", "results.json", "compare.md", "curves.png", "correlations.png"):
    assert (tmp_path / path).is_file(), path
  for setting in SETTINGS:
    for seed in range(2):
      assert (tmp_path / "frozenlake" / setting / str(seed) / "metrics.jsonl").is_file()
  saved = json.loads((tmp_path / "results.json").read_text())
  assert set(saved["summary"]["frozenlake"]) == set(SETTINGS) == {r["setting"] for r in saved["runs"]}
  assert len(saved["runs"]) == 4 and saved["runs"] == json.loads(json.dumps(results["runs"]))
  for r in saved["runs"]:
    assert 0.0 <= r["final_val_success"] <= 1.0 and r["curves"]["val/success"][0] == [0, r["sft_val_success"]]
    assert r["mi_zscore"] is not None and r["policy_entropy"] > 0.0
    assert r["gain"] == pytest.approx(r["final_val_success"] - r["sft_val_success"], abs=1e-9) and r["gain_se"] >= 0.0
  no_filter = [r for r in saved["runs"] if r["setting"] == "no_filter"]
  assert all(r["kept_ratio"] == 1.0 for r in no_filter)
  finals = [r["final_val_success"] for r in saved["runs"]]
  for key in ("mi_zscore", "policy_entropy"):
    expected = spearman([r[key] for r in saved["runs"]], finals)
    assert saved["spearman"]["frozenlake"][key] == (None if math.isnan(expected) else pytest.approx(expected))

  table = (tmp_path / "compare.md").read_text()
  assert "| frozenlake | no_filter | 2 |" in table and "| frozenlake | snr_filter | 2 |" in table
  assert "67.0 → 77.9 (PPO)" in table and "+0.39" in table and "curves.png" in table and "correlations.png" in table
  for name in ("curves.png", "correlations.png"):
    image = np.asarray(Image.open(tmp_path / name).convert("RGB"))
    assert image.shape[0] > 300 and image.std() > 10, name  # a real picture, not a blank canvas
    for setting, color in COLORS.items():  # each setting drew data in its own colour
      assert _pixels_near(image, color) > 20, (name, setting)

