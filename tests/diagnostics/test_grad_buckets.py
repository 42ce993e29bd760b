"""Reward-variance buckets (vs a RAGEN-style loop) and per-bucket gradient norms (vs analytic numpy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ragen_jax.diagnostics.grad_buckets import assign_buckets, bucket_episode_masks, bucket_grad_norms, bucket_ranges


def reference_quantile(scores, num_buckets, keep):
  """RAGEN's equal-count split of the kept groups, remainder into the last bucket."""
  out = np.full(len(scores), -1)
  kept = np.flatnonzero(keep)
  used = min(num_buckets, len(kept))
  if used == 0:
    return out
  per, start = len(kept) // used, 0
  ranked = kept[np.argsort(scores[kept], kind="stable")]
  for k in range(used):
    size = per + (len(kept) % used if k == used - 1 else 0)
    out[ranked[start:start + size]] = k
    start += size
  return out


@pytest.mark.parametrize("num_groups,num_buckets,kept_share", [(8, 6, 1.0), (20, 6, 0.7), (3, 6, 1.0), (13, 4, 0.5),
                                                              (5, 6, 0.0)])
def test_quantile_buckets_match_reference(num_groups, num_buckets, kept_share):
  rng = np.random.default_rng(num_groups)
  scores = np.round(rng.exponential(size=num_groups), 1).astype(np.float32)  # with ties
  keep = rng.random(num_groups) < kept_share
  got = assign_buckets(jnp.asarray(scores), num_buckets=num_buckets, group_mask=jnp.asarray(keep))
  np.testing.assert_array_equal(np.asarray(got), reference_quantile(scores, num_buckets, keep))


def test_fixed_buckets_use_half_open_edges():
  scores = jnp.asarray([0.0, 0.99, 1.0, 2.5, 4.99, 5.0, 17.0, 3.0])
  got = assign_buckets(scores, mode="fixed", group_mask=jnp.asarray([True] * 7 + [False]))
  np.testing.assert_array_equal(np.asarray(got), [0, 0, 1, 2, 4, 5, 5, -1])
  got = assign_buckets(jnp.asarray([0.05, 0.2, 0.7]), num_buckets=3, mode="fixed", edges=(0.1, 0.5, 0.6))
  np.testing.assert_array_equal(np.asarray(got), [-1, 0, 2])
  with pytest.raises(ValueError, match="increasing edges"):
    assign_buckets(scores, num_buckets=2, mode="fixed", edges=(1.0, 0.0))


def test_bucket_ranges_and_episode_masks():
  reward_std = jnp.asarray([0.3, 0.1, 0.5, 0.2])
  bucket = jnp.asarray([1, 0, 1, -1])
  low, high, count = bucket_ranges(reward_std, bucket, 3)
  np.testing.assert_allclose(np.asarray(low)[:2], [0.1, 0.3])
  np.testing.assert_allclose(np.asarray(high)[:2], [0.1, 0.5])
  assert np.isnan(np.asarray(low)[2]) and np.asarray(count).tolist() == [1, 2, 0]
  masks = bucket_episode_masks(bucket, jnp.asarray([0, 0, 1, 2, 3, 3]), 3)
  np.testing.assert_array_equal(np.asarray(masks), [[0, 0, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0], [0] * 6])


def test_per_bucket_grad_norms_of_a_linear_model():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(12, 3)), rng.normal(size=12)
  params = {"w": jnp.asarray(rng.normal(size=3)), "b": jnp.asarray(0.5)}

  def loss_terms(p, mask_B):
    err_B = jnp.asarray(x) @ p["w"] + p["b"] - jnp.asarray(y)
    task = jnp.sum(jnp.where(mask_B, err_B**2, 0.0)) / jnp.maximum(jnp.sum(mask_B), 1)
    return {"task": task, "reg": 0.1 * jnp.sum(p["w"] ** 2)}

  masks = np.zeros((3, 12), bool)
  masks[0, :4], masks[1, 4:12] = True, True  # bucket 2 empty
  got = jax.jit(lambda p, m: bucket_grad_norms(loss_terms, p, m))(params, jnp.asarray(masks))

  w, b = np.asarray(params["w"]), float(params["b"])
  for k in range(3):
    m = masks[k]
    err = x @ w + b - y
    n = max(m.sum(), 1)
    grad_w, grad_b = 2 / n * (m * err) @ x, 2 / n * (m * err).sum()
    np.testing.assert_allclose(float(got["task"][k]), np.sqrt(grad_w @ grad_w + grad_b**2), rtol=1e-5)
    np.testing.assert_allclose(float(got["reg"][k]), 0.2 * np.linalg.norm(w), rtol=1e-5)
  assert float(got["task"][2]) == 0.0
