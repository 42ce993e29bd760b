"""Sampling rules: greedy, temperature, top-k and top-p, with the log-probs the learner needs."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingRule:
  """Static sampling settings (hashable; part of the jit cache key).

  temperature 0 means greedy. top_k 0 and top_p 1.0 disable those truncations.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def sampling_logits(logits_BV: jax.Array, rule: SamplingRule) -> jax.Array:
  """The logits of the distribution actually sampled from (masked entries are -inf)."""
  logits = logits_BV.astype(jnp.float32) / rule.temperature
  if rule.top_k:
    kth = jax.lax.top_k(logits, rule.top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, _NEG_INF, logits)
  if rule.top_p < 1.0:
    sorted_desc = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_desc, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p (the token that crosses it included).
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    cutoff = jnp.min(jnp.where(mass_before < rule.top_p, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, _NEG_INF, logits)
  return logits


def _inverse_cdf_draw(key, probs_BV: jax.Array) -> jax.Array:
  """One exact categorical draw per row from a single uniform (Gumbel-max would need B×V)."""
  cdf_BV = jnp.cumsum(probs_BV, axis=-1)
  u_B1 = jax.random.uniform(key, (probs_BV.shape[0], 1)) * cdf_BV[:, -1:]
  token = jnp.sum(cdf_BV <= u_B1, axis=-1)
  # Never land on a zero-probability entry (possible only through float rounding at the tail).
  last_kept = probs_BV.shape[1] - 1 - jnp.argmax((probs_BV > 0)[:, ::-1], axis=-1)
  return jnp.minimum(token, last_kept).astype(jnp.int32)


def sample(key, logits_BV: jax.Array, rule: SamplingRule):
  """Draws one token per row.

  Returns (tokens int32[B], sampling_logp float32[B] under the sampled distribution,
  model_logp float32[B] under the unmodified model: temperature 1, no truncation).
  """
  model_logp_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
  if rule.greedy:
    tokens = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    sampling_logp = jnp.zeros(tokens.shape, jnp.float32)
  else:
    sampling_logp_BV = jax.nn.log_softmax(sampling_logits(logits_BV, rule), axis=-1)
    tokens = _inverse_cdf_draw(key, jnp.exp(sampling_logp_BV))
    sampling_logp = jnp.take_along_axis(sampling_logp_BV, tokens[:, None], -1)[:, 0]
  model_logp = jnp.take_along_axis(model_logp_BV, tokens[:, None], -1)[:, 0]
  return tokens, sampling_logp, model_logp
