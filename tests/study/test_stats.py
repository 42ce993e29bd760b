"""The study's statistics against scipy on fixed inputs."""

import math

import numpy as np
import pytest
from scipy import stats

from ragen_jax.study.stats import bootstrap_indices, mean_se, paired_test, spearman_ci

AFTER = [0.61, 0.66, 0.62, 0.58, 0.70, 0.64]
BEFORE = [0.57, 0.58, 0.57, 0.59, 0.60, 0.57]


def test_mean_se_matches_scipy_and_skips_missing_values():
  result = mean_se(AFTER + [None, float("nan")])
  assert result["n"] == 6 and result["mean"] == pytest.approx(np.mean(AFTER))
  assert result["se"] == pytest.approx(stats.sem(AFTER))
  assert mean_se([0.5]) == {"n": 1, "mean": 0.5, "se": None} and mean_se([]) == {"n": 0, "mean": None, "se": None}


def test_paired_test_matches_scipy():
  result = paired_test(AFTER + [None], BEFORE + [0.5])  # the pair with a missing side is left out
  t, w = stats.ttest_rel(AFTER, BEFORE), stats.wilcoxon(AFTER, BEFORE)
  assert result["n"] == 6 and result["mean"] == pytest.approx(np.mean(np.subtract(AFTER, BEFORE)))
  assert result["se"] == pytest.approx(stats.sem(np.subtract(AFTER, BEFORE)))
  assert (result["t"], result["t_p"]) == (pytest.approx(t.statistic), pytest.approx(t.pvalue))
  assert (result["wilcoxon"], result["wilcoxon_p"]) == (pytest.approx(w.statistic), pytest.approx(w.pvalue))


def test_paired_test_without_differences_or_pairs():
  same = paired_test([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
  assert same["mean"] == 0.0 and same["wilcoxon"] is None and same["wilcoxon_p"] is None
  assert paired_test([0.5], [0.4])["t"] is None


def test_spearman_ci_matches_scipy_on_the_same_resamples():
  rng = np.random.default_rng(1)
  x = rng.integers(0, 5, 12).astype(float)  # ties
  y = x + rng.normal(0, 2, 12)
  result = spearman_ci(list(x) + [float("nan")], list(y) + [1.0], resamples=300, seed=3)
  assert result["n"] == 12 and result["rho"] == pytest.approx(stats.spearmanr(x, y).statistic)
  rhos = [stats.spearmanr(x[i], y[i]).statistic for i in bootstrap_indices(12, 300, 3)]
  rhos = [r for r in rhos if math.isfinite(r)]  # a resample with a constant side has no rank correlation
  assert result["low"] == pytest.approx(np.percentile(rhos, 2.5))
  assert result["high"] == pytest.approx(np.percentile(rhos, 97.5))
  assert result["low"] <= result["rho"] <= result["high"]


def test_spearman_ci_undefined_for_a_constant_side():
  assert spearman_ci([1, 1, 1], [1, 2, 3]) == {"n": 3, "rho": None, "low": None, "high": None}
