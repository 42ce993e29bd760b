"""MI proxy family vs an independent float64 numpy implementation, plus synthetic collapse."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.diagnostics import ZscoreEMA, apply_zscore_emas, mi_metrics, mi_metrics_from_scores, update_zscore_ema


def log_mean_exp(x):
  m = x.max(axis=1, keepdims=True)
  return (m + np.log(np.exp(x - m).mean(axis=1, keepdims=True)))[:, 0]


def reference_family(scores, matched, marginal, own, equiv, rows):
  """Float64 numpy; retrieval breaks ties towards the lower column index (stable sort)."""
  n = scores.shape[1]
  equiv = equiv | np.eye(n, dtype=bool)
  scores, matched, marginal, own = scores[rows], matched[rows], marginal[rows], own[rows]
  gap = matched - marginal
  ranked = np.argsort(-scores, axis=1, kind="stable")
  out = {"mi_estimate": gap.mean(), "mi_upper_bound": math.log(n), "conditional_entropy_est": -matched.mean(),
         "reasoning_entropy_est": -marginal.mean(), "marginal_std": marginal.std(),
         "mi_zscore": (gap / (marginal.std() + 1e-3)).mean(),
         "retrieval_chance_level": np.mean([equiv[c].sum() / n for c in own])}
  for k in (1, 2, 4, 8):
    hits = [equiv[c, ranked[r, :k]].any() for r, c in enumerate(own)]
    out["retrieval_accuracy" if k == 1 else f"retrieval_accuracy_at_{k}"] = np.mean(hits)
  out["retrieval_above_chance"] = out["retrieval_accuracy"] - out["retrieval_chance_level"]
  return out


def assert_metrics_close(got, want, suffix=""):
  for name, value in want.items():
    np.testing.assert_allclose(float(got[name + suffix]), value, rtol=2e-5, atol=2e-5, err_msg=name + suffix)


def random_case(rng, rows, cols, duplicates=0, ties=False):
  own = rng.integers(0, cols, size=rows)
  logp = rng.normal(-3.0, 1.5, size=(rows, cols))
  logp[np.arange(rows), own] += rng.uniform(0, 2, size=rows)  # some input dependence
  if ties:
    logp = np.round(logp)  # many exact ties, own column included
  equiv = np.eye(cols, dtype=bool)
  pairs = rng.choice(cols, 2 * duplicates, replace=False).reshape(-1, 2)
  for i, j in pairs:  # identical prompts give identical columns
    logp[:, j] = logp[:, i]
    equiv[i, j] = equiv[j, i] = True
  return logp, own, equiv


@pytest.mark.parametrize("rows,cols,duplicates,ties", [(16, 8, 0, False), (20, 6, 2, False), (12, 9, 1, True),
                                                       (5, 1, 0, False), (7, 3, 0, True)])
def test_matches_float64_numpy(rows, cols, duplicates, ties):
  rng = np.random.default_rng(rows * 100 + cols)
  logp, own, equiv = random_case(rng, rows, cols, duplicates, ties)
  want = reference_family(logp, logp[np.arange(rows), own], log_mean_exp(logp), own, equiv, np.ones(rows, bool))
  got = mi_metrics(jnp.asarray(logp, jnp.float32), jnp.asarray(own), jnp.asarray(equiv))
  assert_metrics_close(got, want)


def test_single_column_is_degenerate_but_finite():
  got = mi_metrics(jnp.asarray([[-2.0], [-5.0]]), jnp.asarray([0, 0]))
  assert float(got["mi_estimate"]) == 0.0 and float(got["mi_upper_bound"]) == 0.0
  assert float(got["retrieval_accuracy"]) == 1.0 and float(got["retrieval_chance_level"]) == 1.0
  assert all(np.isfinite(float(v)) for v in got.values())


def test_row_mask_drops_padding_rows():
  rng = np.random.default_rng(7)
  logp, own, equiv = random_case(rng, 10, 5, duplicates=1)
  rows = np.arange(10) < 7
  want = reference_family(logp, logp[np.arange(10), own], log_mean_exp(logp), own, equiv, rows)
  got = jax.jit(mi_metrics)(jnp.asarray(logp, jnp.float32), jnp.asarray(own), jnp.asarray(equiv), jnp.asarray(rows))
  assert_metrics_close(got, want)


@pytest.mark.parametrize("convention", ["paper", "code"])
def test_from_scores_conventions(convention):
  rng = np.random.default_rng(8)
  rows, cols = 12, 6
  lengths = rng.integers(3, 40, size=rows)
  sum_logp, own, equiv = random_case(rng, rows, cols, duplicates=1)
  sum_logp = sum_logp * lengths[:, None]
  per_token = sum_logp / lengths[:, None]
  marginal_seq = log_mean_exp(sum_logp)
  marginal = marginal_seq / lengths if convention == "paper" else log_mean_exp(per_token)
  # log_mean_exp already subtracts log N, so the paper's form is (logsumexp S − log N) / length.
  idx = np.arange(rows)
  all_rows = np.ones(rows, bool)
  got = mi_metrics_from_scores(jnp.asarray(sum_logp, jnp.float32), jnp.asarray(lengths), jnp.asarray(own),
                               jnp.asarray(equiv), marginal=convention)
  assert_metrics_close(got, reference_family(per_token, per_token[idx, own], marginal, own, equiv, all_rows))
  assert_metrics_close(got, reference_family(sum_logp, sum_logp[idx, own], marginal_seq, own, equiv, all_rows),
                       suffix="_seq")


def test_conventions_differ_when_lengths_differ():
  rng = np.random.default_rng(9)
  sum_logp = rng.normal(-40, 10, size=(8, 4))
  lengths = jnp.asarray([5, 40, 7, 30, 9, 12, 50, 3])
  args = (jnp.asarray(sum_logp, jnp.float32), lengths, jnp.arange(8) % 4)
  paper, code = mi_metrics_from_scores(*args, marginal="paper"), mi_metrics_from_scores(*args, marginal="code")
  assert abs(float(paper["mi_estimate"]) - float(code["mi_estimate"])) > 1e-3
  assert float(paper["mi_estimate_seq"]) == float(code["mi_estimate_seq"])


def test_synthetic_collapse_has_no_mi_and_chance_retrieval():
  rng = np.random.default_rng(10)
  rows, cols = 4000, 8
  # Template collapse: the reasoning's log-prob depends on the row only (tiny column noise).
  logp = rng.normal(-50, 10, size=(rows, 1)) + 1e-3 * rng.normal(size=(rows, cols))
  got = mi_metrics(jnp.asarray(logp, jnp.float32), jnp.asarray(rng.integers(0, cols, size=rows)))
  assert abs(float(got["mi_estimate"])) < 1e-3
  assert float(got["retrieval_chance_level"]) == pytest.approx(1 / 8)
  assert abs(float(got["retrieval_above_chance"])) < 0.02  # 3.8 standard errors at R = 4000
  assert float(got["retrieval_accuracy_at_4"]) == pytest.approx(0.5, abs=0.03)


def test_strong_input_dependence_reaches_log_n():
  rng = np.random.default_rng(11)
  rows, cols = 64, 8
  own = rng.integers(0, cols, size=rows)
  logp = rng.normal(-30, 1, size=(rows, cols))
  logp[np.arange(rows), own] += 25.0
  got = mi_metrics(jnp.asarray(logp, jnp.float32), jnp.asarray(own))
  assert float(got["retrieval_accuracy"]) == 1.0
  assert math.log(8) - 1e-3 < float(got["mi_estimate"]) <= math.log(8) + 1e-6
  assert float(got["retrieval_above_chance"]) == pytest.approx(1 - 1 / 8)


def test_shape_errors():
  with pytest.raises(ValueError, match="own_col"):
    mi_metrics(jnp.zeros((4, 3)), jnp.zeros(5, jnp.int32))
  with pytest.raises(ValueError, match="col_equiv"):
    mi_metrics(jnp.zeros((4, 3)), jnp.zeros(4, jnp.int32), jnp.eye(4, dtype=bool))
  with pytest.raises(ValueError, match="marginal"):
    mi_metrics_from_scores(jnp.zeros((4, 3)), jnp.ones(4), jnp.zeros(4, jnp.int32), marginal="both")


def test_zscore_ema_starts_at_first_value_and_decays():
  state = ZscoreEMA.init()
  stds, mis = [2.0, 4.0, 1.0], [1.0, 0.5, 0.25]
  want_ema = [2.0, 0.9 * 2.0 + 0.1 * 4.0, 0.9 * 2.2 + 0.1 * 1.0]
  update = jax.jit(update_zscore_ema)
  for std, mi, ema in zip(stds, mis, want_ema):
    state, z = update(state, jnp.float32(mi), jnp.float32(std))
    np.testing.assert_allclose(float(state.marginal_std), ema, rtol=1e-6)
    np.testing.assert_allclose(float(z), mi / (ema + 1e-3), rtol=1e-6)
  assert int(state.steps) == 3
  leaves, treedef = jax.tree.flatten(state)  # a pytree: checkpointable as is
  assert len(leaves) == 2 and jax.tree.unflatten(treedef, leaves) == state


def test_apply_zscore_emas_keeps_variants_and_families_apart():
  rng = np.random.default_rng(12)
  sum_logp = jnp.asarray(rng.normal(-40, 10, size=(8, 4)), jnp.float32)
  metrics = mi_metrics_from_scores(sum_logp, jnp.full(8, 10), jnp.arange(8) % 4)
  states, out = apply_zscore_emas({}, "first_turn", metrics)
  assert set(states) == {"first_turn", "first_turn_seq"}
  np.testing.assert_allclose(float(out["mi_zscore_ema"]),
                             float(metrics["mi_estimate"]) / (float(metrics["marginal_std"]) + 1e-3), rtol=1e-6)
  np.testing.assert_allclose(float(out["mi_zscore_ema_seq"]),
                             float(metrics["mi_estimate_seq"]) / (float(metrics["marginal_std_seq"]) + 1e-3),
                             rtol=1e-6)
  states, _ = apply_zscore_emas(states, "trajectory", mi_metrics(sum_logp, jnp.arange(8) % 4))
  assert set(states) == {"first_turn", "first_turn_seq", "trajectory"}
  assert int(states["first_turn"].steps) == 1 and int(states["trajectory"].steps) == 1
