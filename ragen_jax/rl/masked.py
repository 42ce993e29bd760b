"""Reductions over the masked (response) tokens of a [B, T] batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_sum(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """Sum of `x` where `mask` is set (values outside the mask never leak, even NaN)."""
  return jnp.sum(jnp.where(mask, x, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
  """Mean of `x` over the mask; 0 where the mask is empty."""
  count = jnp.sum(mask.astype(jnp.float32), axis=axis)
  return masked_sum(x, mask, axis) / jnp.maximum(count, 1.0)


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
  """(x − mean) / sqrt(var + eps) over the mask, var unbiased (as verl); 0 outside."""
  count = jnp.sum(mask.astype(jnp.float32))
  mean = masked_mean(x, mask)
  var = masked_sum(jnp.square(x - mean), mask) / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(mask, (x - mean) * jax.lax.rsqrt(var + eps), 0.0)
