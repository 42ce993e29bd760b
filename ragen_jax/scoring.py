"""Scoring a packed [B, T] batch: teacher-forced per-token log-probs, entropies and
critic values, and reductions over its masked (response) tokens.

Shared by `rl` (the update), `diagnostics` and `sft`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.transformer import Transformer


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


def token_entropy(logits_BTV: jax.Array) -> jax.Array:
  """Entropy of softmax(logits) at every position, float32[B, T], as log Z - sum(p * x) with x the logits less
  their maximum (uncentred, large logits lose the entropy's digits to cancellation)."""
  logits_BTV = logits_BTV.astype(jnp.float32)
  centred_BTV = logits_BTV - jax.lax.stop_gradient(jnp.max(logits_BTV, axis=-1, keepdims=True))
  log_normalizer_BT = jnp.log(jnp.sum(jnp.exp(centred_BTV), axis=-1))
  probs_BTV = jnp.exp(centred_BTV - log_normalizer_BT[..., None])
  return log_normalizer_BT - jnp.sum(probs_BTV * centred_BTV, axis=-1)


def _shift_right(x_BT, fill=0.0):
  """Aligns position t-1's prediction with token t (position 0 gets `fill`)."""
  return jnp.concatenate([jnp.full_like(x_BT[:, :1], fill), x_BT[:, :-1]], axis=1)


def _next_logp_and_entropy(module: Transformer, params, hidden_BTD, next_tokens_BT):
  """log p(next token) and the entropy at every position, from the final hidden states."""
  logits_BTV = module.apply({"params": params}, hidden_BTD, method="lm_logits")
  log_normalizer_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  # The next token's logit by a one-hot select: its gradient is elementwise, where a gather's is a scatter.
  is_next_BTV = next_tokens_BT[..., None] == jnp.arange(logits_BTV.shape[-1])
  next_logp_BT = jnp.sum(jnp.where(is_next_BTV, logits_BTV, 0.0), axis=-1) - log_normalizer_BT
  return next_logp_BT, token_entropy(logits_BTV)


def _chunked_next_logp_and_entropy(module: Transformer, params, hidden_BTD, next_tokens_BT, chunk: int):
  """`_next_logp_and_entropy` over blocks of `chunk` tokens in a scan, each block rematerialised: the forward
  and the backward hold one block's [B, chunk, V] logits, never the whole sequence's."""
  b, t, d = hidden_BTD.shape
  n = -(-t // chunk)
  pad = n * chunk - t
  hidden_NBCD = jnp.pad(hidden_BTD, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, d).swapaxes(0, 1)
  tokens_NBC = jnp.pad(next_tokens_BT, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
  block = jax.checkpoint(lambda p, h, tok: _next_logp_and_entropy(module, p, h, tok))
  _, (logp_NBC, entropy_NBC) = jax.lax.scan(lambda carry, x: (carry, block(params, *x)), None,
                                            (hidden_NBCD, tokens_NBC))
  unblock = lambda x_NBC: x_NBC.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]  # noqa: E731
  return unblock(logp_NBC), unblock(entropy_NBC)


def token_logp_and_entropy(config: ModelConfig, params, tokens_BT, valid_BT, segment_BT=None, visible_from_BT=None):
  """(logp_BT, entropy_BT): log p(token t | tokens < t) and the entropy of that
  distribution, at every t ≥ 1 (0 at t = 0), float32. segment_BT / visible_from_BT:
  the context windows the tokens were sampled with (see `models.transformer`).

  With `config.logits_chunk` shorter than the sequence, the LM head runs over blocks of that many tokens
  (same values and gradients, a fraction of the logits' memory)."""
  module = Transformer(config)
  hidden, _ = module.apply({"params": params}, tokens_BT, valid_BT, segment_BT=segment_BT,
                           visible_from_BT=visible_from_BT)
  next_tokens_BT = jnp.pad(tokens_BT[:, 1:], ((0, 0), (0, 1)))
  if 0 < config.logits_chunk < tokens_BT.shape[1]:
    next_logp, entropy = _chunked_next_logp_and_entropy(module, params, hidden, next_tokens_BT, config.logits_chunk)
  else:
    next_logp, entropy = _next_logp_and_entropy(module, params, hidden, next_tokens_BT)
  return _shift_right(next_logp), _shift_right(entropy)


def token_values(config: ModelConfig, critic_params, tokens_BT, valid_BT, segment_BT=None, visible_from_BT=None):
  """float32[B, T]: the critic's value of the prefix before token t (0 at t = 0)."""
  module = Transformer(config, with_value_head=True)
  hidden, _ = module.apply({"params": critic_params}, tokens_BT, valid_BT, segment_BT=segment_BT,
                           visible_from_BT=visible_from_BT)
  return _shift_right(module.apply({"params": critic_params}, hidden, method="values"))
