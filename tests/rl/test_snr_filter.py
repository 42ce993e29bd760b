"""SNR-Aware Filtering against SPEC §6 vectors and a float64 loop reference."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.rl import snr_filter
from ragen_jax.rl.snr_filter import episode_mask, filter_metrics, group_scores, loss_scale, select_groups


def reference_select(scores, strategy, value, filter_type, prob_mode, include_zero, eps):
  """Float64 loop transliteration of RAGEN's `_select_top_groups`; returns kept group indices."""
  scores = np.asarray(scores, np.float64)
  num_groups = len(scores)
  idx = np.arange(num_groups)
  if not include_zero:
    keep = np.abs(scores) > 1e-10
    scores, idx = scores[keep], idx[keep]
    if len(idx) == 0:
      return set()
  largest = filter_type == "largest"
  order = np.argsort(-scores if largest else scores, kind="stable")
  if strategy == "top_p":
    if value >= 1.0:
      return set(idx.tolist())
    if prob_mode == "softmax":
      logits = scores if largest else -scores
      p = np.exp(logits - logits.max())
      p /= p.sum()
      porder = np.argsort(-p, kind="stable")
      k = min(int(np.searchsorted(np.cumsum(p[porder]), value, side="left")) + 1, len(idx))
      return set(idx[porder[:k]].tolist())
    threshold = value * scores.sum() - eps
    total, count = 0.0, 0
    for s in scores[order]:
      if total >= threshold or s <= 0:
        break
      total += s
      count += 1
    return set(idx[order[:count]].tolist()) if total >= threshold else set()
  if strategy in ("top_k", "top_k_abs"):
    k = int(value * num_groups if strategy == "top_k" else value)
    k = max(min(k, len(idx)), 1)
    return set(idx[order[:k]].tolist())
  # min_p's 1e-10 slacks sit below float32 resolution; like RAGEN (`scores.float()`) compare in float32.
  scores = scores.astype(np.float32)
  if largest:
    return set(idx[scores >= np.float32(value) * scores.max() - np.float32(1e-10)].tolist())
  return set(idx[scores <= scores.min() / np.float32(value + 1e-10) + np.float32(1e-10)].tolist())


def kept(mask):
  return set(np.flatnonzero(np.asarray(mask)).tolist())


@pytest.mark.parametrize("scores,kwargs,expected", [
    ([4, 3, 2, 1], dict(value=0.6), {0, 1}),
    ([1, 1, 1], dict(value=0.6, prob_mode="softmax"), {0, 1}),
    ([3, 1, 1, 0], dict(value=0.9, include_zero=False), {0, 1, 2}),
])
def test_spec_reference_vectors(scores, kwargs, expected):
  assert kept(select_groups(jnp.asarray(scores, jnp.float32), **kwargs)) == expected


def realistic_scores(rng, num_groups):
  """Variances of 0/1 and Sokoban-like rewards: many zeros and exact ties."""
  kind = rng.integers(3)
  if kind == 0:
    rewards = (rng.random((num_groups, 8)) < rng.random((num_groups, 1))).astype(np.float64)
  elif kind == 1:
    rewards = rng.choice([-1.0, -0.5, 10.0], size=(num_groups, 8), p=[0.6, 0.3, 0.1])
  else:
    return rng.exponential(size=num_groups) * (rng.random(num_groups) < 0.8)
  return rewards.var(axis=1, ddof=1)


@pytest.mark.parametrize("strategy,prob_mode", [("top_p", "linear"), ("top_p", "softmax"), ("top_k", "linear"),
                                                ("top_k_abs", "linear"), ("min_p", "linear")])
def test_matches_float64_reference_on_random_scores(strategy, prob_mode):
  rng = np.random.default_rng(0)
  values = [1.0, 2.0, 5.0] if strategy == "top_k_abs" else [0.25, 0.6, 0.9, 1.0]
  for num_groups, value, filter_type, include_zero in itertools.product(
      [1, 5, 11], values, ["largest", "smallest"], [True, False]):
    for _ in range(10):  # eager: each op compiles once per shape, so few distinct G keep this fast
      scores = realistic_scores(rng, num_groups).astype(np.float32)
      keep = select_groups(jnp.asarray(scores), strategy=strategy, value=value, filter_type=filter_type,
                           prob_mode=prob_mode, include_zero=include_zero)
      want = reference_select(scores, strategy, value, filter_type, prob_mode, include_zero, 0.01)
      assert kept(keep) == want, (scores, value, filter_type, include_zero)


def test_linear_top_p_keeps_smallest_prefix_reaching_threshold():
  rng = np.random.default_rng(1)
  nonempty = 0
  for rho in [0.1, 0.3, 0.5, 0.7, 0.9, 0.97]:
    for scores in rng.exponential(size=(40, 13)).astype(np.float32):
      keep = np.asarray(select_groups(jnp.asarray(scores), value=rho))
      if not keep.any():
        continue
      nonempty += 1
      threshold = rho * scores.astype(np.float64).sum() - 0.01
      kept_scores = np.sort(scores[keep].astype(np.float64))[::-1]
      assert kept_scores.sum() >= threshold
      assert kept_scores[:-1].sum() < threshold  # dropping the last one falls short
      assert kept_scores.min() >= scores[~keep].max(initial=-np.inf)  # a prefix of the sorted order
  assert nonempty > 200


@pytest.mark.parametrize("strategy", snr_filter.STRATEGIES)
def test_value_at_least_one_keeps_all_for_top_p_and_groups_stay_whole(strategy):
  rng = np.random.default_rng(2)
  scores = jnp.asarray(rng.exponential(size=8), jnp.float32)
  if strategy == "top_p":
    assert np.asarray(select_groups(scores, value=1.0)).all()
    assert np.asarray(select_groups(scores, value=1.3, prob_mode="softmax")).all()
  keep = select_groups(scores, strategy=strategy, value=0.5 if strategy != "top_k_abs" else 3)
  group_ids = jnp.asarray(rng.permutation(np.repeat(np.arange(8), 4)))
  per_episode = np.asarray(episode_mask(keep, group_ids))
  for g in range(8):  # every episode of a group shares the group's decision
    assert set(per_episode[np.asarray(group_ids) == g]) == {bool(keep[g])}


def test_nothing_kept_when_threshold_unreachable():
  # Only the first score is positive: the walk stops at 0 before reaching 0.9·Σ − eps.
  assert not np.asarray(select_groups(jnp.asarray([1.0, 0.0, 1.0]), value=0.9, filter_type="smallest")).any()
  assert not np.asarray(select_groups(jnp.zeros(4), value=0.9)).any()


def test_jit_matches_eager_and_never_retraces_on_new_scores():
  traces = []

  def select(scores):
    traces.append(None)
    return select_groups(scores, value=0.6)

  select_jit = jax.jit(select)
  rng = np.random.default_rng(3)
  kept_counts = set()
  for _ in range(10):
    scores = jnp.asarray(realistic_scores(rng, 8), jnp.float32)
    eager = np.asarray(select_groups(scores, value=0.6))
    np.testing.assert_array_equal(np.asarray(select_jit(scores)), eager)
    kept_counts.add(int(eager.sum()))
  assert len(traces) == 1
  assert len(kept_counts) > 1  # the kept count really changed between calls


def test_group_scores_match_numpy_for_both_layouts():
  rng = np.random.default_rng(4)
  rewards_GS = rng.normal(size=(5, 7))
  for metric, ddof in itertools.product(["variance", "std"], [0, 1]):
    want = rewards_GS.var(axis=1, ddof=ddof) if metric == "variance" else rewards_GS.std(axis=1, ddof=ddof)
    got = group_scores(jnp.asarray(rewards_GS, jnp.float32), metric=metric, ddof=ddof)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    perm = rng.permutation(35)
    got_flat = group_scores(jnp.asarray(rewards_GS.reshape(-1)[perm], jnp.float32),
                            jnp.asarray(np.repeat(np.arange(5), 7)[perm]), 5, metric=metric, ddof=ddof)
    np.testing.assert_allclose(np.asarray(got_flat), want, rtol=1e-5, atol=1e-6)


def test_group_scores_ignore_invalid_episodes():
  rewards_GS = np.array([[0.0, 1.0, 5.0], [2.0, 2.0, 9.0]])
  valid = np.array([[True, True, False], [True, True, False]])
  got = group_scores(jnp.asarray(rewards_GS), valid=jnp.asarray(valid))
  np.testing.assert_allclose(np.asarray(got), [0.5, 0.0])


def test_filter_metrics_match_numpy():
  rng = np.random.default_rng(5)
  rewards_GS = rng.normal(size=(6, 4)).astype(np.float32)
  scores = np.array(group_scores(jnp.asarray(rewards_GS)))
  scores[2] = 0.0
  keep = np.array([True, False, False, True, True, False])
  m = filter_metrics(jnp.asarray(rewards_GS), jnp.asarray(keep), jnp.asarray(scores))
  std = rewards_GS.std(axis=1, ddof=1)
  np.testing.assert_allclose(float(m["in_group_reward_std"]), std.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(m["chosen_in_group_reward_std"]), std[keep].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(m["in_group_reward_mean"]), rewards_GS.mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(m["chosen_in_group_reward_max"]), rewards_GS.max(axis=1)[keep].mean(), rtol=1e-5)
  assert float(m["filter_kept_count"]) == 3 and float(m["filter_kept_ratio"]) == 0.5
  assert float(m["filter_zero_count"]) == 1 and float(m["filter_empty"]) == 0
  empty = filter_metrics(jnp.asarray(rewards_GS), jnp.zeros(6, bool), jnp.asarray(scores))
  assert float(empty["filter_empty"]) == 1 and float(empty["chosen_in_group_reward_std"]) == 0


def test_loss_scale_modes():
  keep = jnp.asarray([True, False, False, False])
  assert float(loss_scale(keep, "none")) == 1.0
  assert float(loss_scale(keep, "linear")) == 0.25
  assert float(loss_scale(keep, "sqrt")) == 0.5


@pytest.mark.parametrize("kwargs", [dict(strategy="top_q"), dict(filter_type="middle"), dict(prob_mode="exp"),
                                    dict(value=0.0)])
def test_bad_settings_raise(kwargs):
  with pytest.raises(ValueError):
    select_groups(jnp.ones(3), **kwargs)
