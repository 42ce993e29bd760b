"""Sampling rules: greedy, temperature, top-k and top-p, with the log-probs the learner needs."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf
DRAW_BLOCK = 256  # vocabulary entries per block of the two-level draw (`_inverse_cdf_draw`)


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
  logits = logits_BV.astype(jnp.float32)
  if rule.temperature != 1.0:
    logits = logits / rule.temperature
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


def _last_positive(x_BN: jax.Array) -> jax.Array:
  """int32[B]: the index of each row's last entry > 0."""
  return (x_BN.shape[1] - 1 - jnp.argmax((x_BN > 0)[:, ::-1], axis=-1)).astype(jnp.int32)


def _log_normaliser(logits_BV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(max_B1, log_sum_B1): log softmax(logits) = (logits - max) - log_sum, as `jax.nn.log_softmax` rounds it."""
  max_B1 = jnp.max(logits_BV, axis=-1, keepdims=True)
  return max_B1, jnp.log(jnp.sum(jnp.exp(logits_BV - max_B1), axis=-1, keepdims=True))


def _logp_of(logits_BV: jax.Array, normaliser, tokens_B: jax.Array) -> jax.Array:
  """float32[B]: the log-probability of each row's token, gathered (never materialised over the vocabulary)."""
  max_B1, log_sum_B1 = normaliser
  return (jnp.take_along_axis(logits_BV, tokens_B[:, None], -1) - max_B1 - log_sum_B1)[:, 0]


def _inverse_cdf_draw(key, logits_BV: jax.Array, normaliser) -> jax.Array:
  """One exact draw per row from softmax(logits_BV) with a single uniform u, by inverse CDF in two levels: the
  block of `DRAW_BLOCK` entries where the blocks' cumulative mass passes u, then the entry within that block.

  Gumbel-max needs B x V uniforms, and a one-level inverse CDF a cumulative sum over all of [B, V]; this reads
  the logits once (each block's mass) and then one block per row, so that drawing a token costs less than the LM
  head's matmul (bench/sampler.py measures both).
  """
  batch, vocab = logits_BV.shape
  blocks = -(-vocab // DRAW_BLOCK)
  padded_BV = jnp.pad(logits_BV, ((0, 0), (0, blocks * DRAW_BLOCK - vocab)), constant_values=_NEG_INF)
  max_B1, log_sum_B1 = normaliser
  probs_BCW = jnp.exp(padded_BV - max_B1 - log_sum_B1).reshape(batch, blocks, DRAW_BLOCK)
  mass_BC = jnp.sum(probs_BCW, axis=-1)
  cdf_BC = jnp.cumsum(mass_BC, axis=-1)
  u_B = jax.random.uniform(key, (batch,)) * cdf_BC[:, -1]
  # Never land on a zero-mass block or entry (possible only through float rounding at the tail).
  block_B = jnp.minimum(jnp.sum(cdf_BC <= u_B[:, None], axis=-1), _last_positive(mass_BC))
  before_B = jnp.where(block_B > 0, jnp.take_along_axis(cdf_BC, jnp.maximum(block_B - 1, 0)[:, None], -1)[:, 0], 0.0)
  probs_BW = jnp.take_along_axis(probs_BCW, block_B[:, None, None], axis=1)[:, 0]
  entry_B = jnp.sum(jnp.cumsum(probs_BW, axis=-1) <= (u_B - before_B)[:, None], axis=-1)
  return (block_B * DRAW_BLOCK + jnp.minimum(entry_B, _last_positive(probs_BW))).astype(jnp.int32)


def sample(key, logits_BV: jax.Array, rule: SamplingRule):
  """Draws one token per row.

  Returns (tokens int32[B], sampling_logp float32[B] under the sampled distribution,
  model_logp float32[B] under the unmodified model: temperature 1, no truncation).
  """
  logits_BV = logits_BV.astype(jnp.float32)
  model_normaliser = _log_normaliser(logits_BV)
  if rule.greedy:
    tokens = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    sampling_logp = jnp.zeros(tokens.shape, jnp.float32)
  else:
    untouched = rule.temperature == 1.0 and not rule.top_k and rule.top_p == 1.0
    sampled_BV = logits_BV if untouched else sampling_logits(logits_BV, rule)
    sampled_normaliser = model_normaliser if untouched else _log_normaliser(sampled_BV)
    tokens = _inverse_cdf_draw(key, sampled_BV, sampled_normaliser)
    sampling_logp = _logp_of(sampled_BV, sampled_normaliser, tokens)
  return tokens, sampling_logp, _logp_of(logits_BV, model_normaliser, tokens)
