"""Statistics of a study: means with standard errors, paired tests, Spearman with a bootstrap interval.

Each returns a dict of plain floats (None where undefined), ready for the study's JSON.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ragen_jax.report.comparison import spearman


def _array(values) -> np.ndarray:
  """float64 values with None as nan."""
  return np.asarray([math.nan if v is None else v for v in values], np.float64)


def _float(value) -> float | None:
  return float(value) if value is not None and math.isfinite(value) else None


def mean_se(values) -> dict:
  """Mean and standard error (ddof 1) of the finite values; the error is None for fewer than 2."""
  values = _array(values)
  values = values[np.isfinite(values)]
  if not values.size:
    return {"n": 0, "mean": None, "se": None}
  se = values.std(ddof=1) / math.sqrt(values.size) if values.size > 1 else None
  return {"n": int(values.size), "mean": float(values.mean()), "se": _float(se)}


def paired_test(after, before) -> dict:
  """`after - before` over pairs where both are finite: the mean difference with its standard error, the paired
  t-test (`scipy.stats.ttest_rel`) and the Wilcoxon signed-rank test (`scipy.stats.wilcoxon`, two-sided)."""
  a, b = _array(after), _array(before)
  keep = np.isfinite(a) & np.isfinite(b)
  a, b = a[keep], b[keep]
  result = {"n": int(a.size)} | {k: v for k, v in mean_se(a - b).items() if k != "n"}
  result |= {"t": None, "t_p": None, "wilcoxon": None, "wilcoxon_p": None}
  if a.size < 2:
    return result
  t = stats.ttest_rel(a, b)
  result |= {"t": _float(t.statistic), "t_p": _float(t.pvalue)}
  if np.any(a != b):  # scipy's Wilcoxon is undefined when every difference is zero
    w = stats.wilcoxon(a, b)
    result |= {"wilcoxon": _float(w.statistic), "wilcoxon_p": _float(w.pvalue)}
  return result


def bootstrap_indices(n: int, resamples: int, seed: int) -> np.ndarray:
  """int[resamples, n]: the pairs each bootstrap resample draws, with replacement."""
  return np.random.default_rng(seed).integers(0, n, (resamples, n))


def spearman_ci(x, y, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
  """Spearman's rho over the finite pairs and its percentile bootstrap interval (resamples of the pairs; a
  resample with a constant side is left out)."""
  x, y = _array(x), _array(y)
  keep = np.isfinite(x) & np.isfinite(y)
  x, y = x[keep], y[keep]
  result = {"n": int(x.size), "rho": _float(spearman(x, y)), "low": None, "high": None}
  if result["rho"] is None:
    return result
  picks = bootstrap_indices(x.size, resamples, seed)
  rx, ry = stats.rankdata(x[picks], axis=1), stats.rankdata(y[picks], axis=1)
  rx, ry = rx - rx.mean(axis=1, keepdims=True), ry - ry.mean(axis=1, keepdims=True)
  norm = np.sqrt((rx ** 2).sum(axis=1) * (ry ** 2).sum(axis=1))
  rhos = (rx * ry).sum(axis=1)[norm > 0] / norm[norm > 0]
  if rhos.size:
    tail = (1 - level) / 2 * 100
    result |= {"low": float(np.percentile(rhos, tail)), "high": float(np.percentile(rhos, 100 - tail))}
  return result
