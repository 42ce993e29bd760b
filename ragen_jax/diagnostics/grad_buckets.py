"""Gradient analysis by reward-variance bucket (SPEC §6, RAGEN's `split_into_buckets`).

Groups are split into buckets by their reward spread; per bucket, the caller's
loss terms (task, entropy, KL, ...) are differentiated on that bucket's
episodes only, and the gradient norms compared across buckets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax

BUCKET_MODES = ("quantile", "fixed")


def assign_buckets(scores_G: jax.Array, *, num_buckets: int = 6, mode: str = "quantile",
                   edges: Sequence[float] | None = None, group_mask: jax.Array | None = None) -> jax.Array:
  """Bucket index per group, int32[G]; −1 for groups outside `group_mask` or below the first edge.

  - `quantile`: groups sorted by score (ties by index) are cut into
    equal-count buckets, the remainder going to the last one; with fewer
    groups than buckets, one group per bucket and the rest stay empty.
  - `fixed`: bucket k holds edges[k] ≤ score < edges[k+1], the last one is
    open-ended; default edges 0, 1, …, num_buckets − 1 (RAGEN's fixed_rv).
  """
  if mode not in BUCKET_MODES:
    raise ValueError(f"bucket mode must be one of {BUCKET_MODES}, got {mode!r}")
  if num_buckets < 1:
    raise ValueError(f"num_buckets must be positive, got {num_buckets}")
  scores_G = jnp.asarray(scores_G, jnp.float32)
  group_mask_G = jnp.ones(scores_G.shape, bool) if group_mask is None else group_mask.astype(bool)
  if mode == "fixed":
    edges = tuple(range(num_buckets)) if edges is None else tuple(edges)
    if len(edges) != num_buckets or list(edges) != sorted(edges):
      raise ValueError(f"fixed mode needs {num_buckets} increasing edges, got {edges}")
    bucket_G = jnp.searchsorted(jnp.asarray(edges, jnp.float32), scores_G, side="right") - 1
    return jnp.where(group_mask_G, bucket_G, -1).astype(jnp.int32)
  order_G = jnp.argsort(jnp.where(group_mask_G, scores_G, jnp.inf), stable=True)
  rank_G = jnp.zeros_like(order_G).at[order_G].set(jnp.arange(scores_G.shape[0], dtype=order_G.dtype))
  num_in = jnp.sum(group_mask_G)
  used_buckets = jnp.minimum(num_buckets, num_in)
  per_bucket = jnp.maximum(num_in // jnp.maximum(used_buckets, 1), 1)
  bucket_G = jnp.minimum(rank_G // per_bucket, used_buckets - 1)
  return jnp.where(group_mask_G, bucket_G, -1).astype(jnp.int32)


def bucket_ranges(values_G: jax.Array, bucket_G: jax.Array,
                  num_buckets: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(min, max, count) of `values_G` (e.g. reward std) per bucket; NaN range when empty."""
  member_KG = bucket_G[None, :] == jnp.arange(num_buckets)[:, None]
  count_K = jnp.sum(member_KG, axis=1)
  low_K = jnp.min(jnp.where(member_KG, values_G, jnp.inf), axis=1)
  high_K = jnp.max(jnp.where(member_KG, values_G, -jnp.inf), axis=1)
  empty_K = count_K == 0
  return jnp.where(empty_K, jnp.nan, low_K), jnp.where(empty_K, jnp.nan, high_K), count_K


def bucket_episode_masks(bucket_G: jax.Array, group_ids_B: jax.Array, num_buckets: int) -> jax.Array:
  """bool[K, B]: episode b belongs to bucket k."""
  return bucket_G[group_ids_B][None, :] == jnp.arange(num_buckets)[:, None]


def bucket_grad_norms(loss_terms_fn: Callable[..., dict[str, jax.Array]], params,
                      episode_masks_KB: jax.Array) -> dict[str, jax.Array]:
  """Global gradient norm of each loss term, per bucket: {term: float32[K]}.

  `loss_terms_fn(params, episode_mask_B)` returns a dict of scalar loss terms
  computed on the masked episodes only. One forward pass per bucket, one
  backward pass per term; buckets run sequentially (`lax.map`) so memory
  stays at one gradient pytree.
  """
  def norms_for(episode_mask_B):
    terms, pullback = jax.vjp(lambda p: loss_terms_fn(p, episode_mask_B), params)
    norms = {}
    for name in terms:
      cotangent = {k: jnp.ones_like(v) if k == name else jnp.zeros_like(v) for k, v in terms.items()}
      (grads,) = pullback(cotangent)
      norms[name] = optax.global_norm(grads)
    return norms

  return jax.lax.map(norms_for, episode_masks_KB)
