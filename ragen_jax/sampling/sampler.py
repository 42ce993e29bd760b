"""Jitted batched sampling with a KV cache that continues across turns.

The flow, all on device:
  `prefill`  : new cache + prompt tokens → SamplerState (cache, next-token logits)
  `decode`   : lax.while_loop sampling up to `max_new_tokens` per row, stopping rows
               on EOS or a stop sequence, exiting early once every row is done
  `extend`   : append more tokens (the next observation) to the same cache
Rows may be left-padded or carry padded chunks: invalid slots are holes in the
cache that attention never sees, and positions count only valid tokens, so a
continued cache gives the logits a fresh prefill of the packed history gives.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.partitioning import constrain
from ragen_jax.models.transformer import KVCache, Transformer, unstack_layers
from ragen_jax.sampling.rules import SamplingRule, sample

PAD_ID = 0


class CacheOverflowError(ValueError):
  """The KV cache has no room for the tokens asked for."""


@flax.struct.dataclass
class SamplerState:
  """What decoding needs between calls.

  cache: the KV cache (its `end` is the next slot to write).
  logits_BV: float32[B, V], the model's logits for each row's next token.
  """

  cache: KVCache
  logits_BV: jax.Array


@flax.struct.dataclass
class Generation:
  """One decode call's output.

  tokens_BN: int32[B, N] generated ids (PAD_ID after a row ends), EOS included.
  lengths_B: int32[B] tokens generated per row (EOS and stop sequence included).
  ended_by_eos_B / ended_by_stop_B: bool[B], why a row ended (neither: budget).
  sampling_logp_BN / model_logp_BN: float32[B, N] log-prob of each token under the
    sampled distribution and under the unmodified model (temperature 1, no truncation).
  """

  tokens_BN: jax.Array
  lengths_B: jax.Array
  ended_by_eos_B: jax.Array
  ended_by_stop_B: jax.Array
  sampling_logp_BN: jax.Array
  model_logp_BN: jax.Array


@flax.struct.dataclass
class _Decoding:
  """The decode loop's carry: the cache and logits, the key, the step, which rows are done, the output so far."""

  state: SamplerState
  key: jax.Array
  step: jax.Array
  done_B: jax.Array
  out: Generation


def _constrain_cache(cache: KVCache) -> KVCache:
  axes = KVCache.KV_AXES
  return cache.replace(k=constrain(cache.k, axes), v=constrain(cache.v, axes),
                       valid=constrain(cache.valid, ("batch", "cache_length")),
                       segment=constrain(cache.segment, ("batch", "cache_length")))


def _extend(config: ModelConfig, params, state: SamplerState, tokens_BT, valid_BT, segment_BT=None,
            visible_from_BT=None, layer_params=None) -> SamplerState:
  module = Transformer(config)
  hidden_BTD, cache = module.apply({"params": params}, tokens_BT, valid_BT, state.cache, segment_BT=segment_BT,
                                   visible_from_BT=visible_from_BT, layer_params=layer_params)
  # Each row's next-token logits come from its last valid token of this chunk.
  last = jnp.max(jnp.where(valid_BT, jnp.arange(tokens_BT.shape[1]), -1), axis=1)
  hidden_B1D = jnp.take_along_axis(hidden_BTD, jnp.maximum(last, 0)[:, None, None], axis=1)
  logits = module.apply({"params": params}, hidden_B1D, method="lm_logits")[:, 0]
  logits = jnp.where((last >= 0)[:, None], logits, state.logits_BV)
  return SamplerState(cache=_constrain_cache(cache), logits_BV=logits)


@functools.partial(jax.jit, static_argnames=("config", "max_len"))
def prefill(config: ModelConfig, params, tokens_BT, valid_BT, max_len: int, segment_BT=None,
            visible_from_BT=None) -> SamplerState:
  """A fresh cache of `max_len` slots holding the prompts (left- or right-padded);
  segment_BT / visible_from_BT: context windows (see `models.transformer`)."""
  batch = tokens_BT.shape[0]
  cache = _constrain_cache(KVCache.zeros(config, batch, max_len))
  empty = SamplerState(cache=cache, logits_BV=jnp.zeros((batch, config.vocab_size), jnp.float32))
  return _extend(config, params, empty, tokens_BT, valid_BT, segment_BT, visible_from_BT)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("state",))
def extend(config: ModelConfig, params, state: SamplerState, tokens_BT, valid_BT, segment_BT=None,
           visible_from_BT=None) -> SamplerState:
  """Appends a padded chunk of tokens (e.g. the next observation) to every row's cache."""
  return _extend(config, params, state, tokens_BT, valid_BT, segment_BT, visible_from_BT)


def stop_sequence_array(stop_sequences) -> np.ndarray:
  """int32[M, L] right-aligned stop sequences, -1 where a shorter one has no token."""
  if any(isinstance(s, str) for s in stop_sequences):
    raise TypeError("stop_sequences are token-id sequences; encode strings with the tokenizer first")
  seqs = [list(map(int, s)) for s in stop_sequences]
  if any(not s for s in seqs):
    raise ValueError("empty stop sequence")
  width = max((len(s) for s in seqs), default=1)
  out = np.full((max(len(seqs), 1), width), -1, np.int32)
  if not seqs:
    out[:] = -2  # matches nothing
  for i, s in enumerate(seqs):
    out[i, width - len(s):] = s
  return out


def _ends_with_stop(tokens_BN, num_generated_B, stops_ML):
  """bool[B]: the row's generated tokens end with one of the stop sequences."""
  width = stops_ML.shape[1]
  idx = num_generated_B[:, None] - width + jnp.arange(width)  # [B, L] positions of the tail
  tail = jnp.take_along_axis(tokens_BN, jnp.maximum(idx, 0), axis=1)
  tail = jnp.where(idx >= 0, tail, -3)  # before the start of generation: never matches a token
  match = (stops_ML[None] == -1) | (tail[:, None, :] == stops_ML[None])
  return jnp.any(jnp.all(match, axis=-1), axis=-1)


@functools.partial(jax.jit, static_argnames=("config", "rule", "max_new_tokens"),
                   donate_argnames=("state",))
def decode(config: ModelConfig, params, state: SamplerState, key, *, rule: SamplingRule,
           max_new_tokens: int, row_max_new_tokens_B=None, stop_sequences_ML=None,
           active_B=None, segment_B=None, visible_from_B=None) -> tuple[SamplerState, Generation]:
  """Samples up to `max_new_tokens` (per row at most `row_max_new_tokens_B`) per row.

  Rows with `active_B` False generate nothing. New tokens get segment `segment_B` and
  see segments from `visible_from_B` (default 0: everything; see `models.transformer`).
  Every generated token, the last one included, is written to the cache, so `extend` can continue the conversation.
  The cache must have `max_new_tokens` free slots (see `check_room`). `config.decode_layers` "unrolled" runs
  the layers over weights sliced once, before the loop (`models.transformer.unstack_layers`).
  """
  batch = state.logits_BV.shape[0]
  eos_ids = jnp.asarray(config.eos_token_ids or (-1,), jnp.int32)
  stops = jnp.full((1, 1), -2, jnp.int32) if stop_sequences_ML is None else stop_sequences_ML
  limit_B = jnp.full((batch,), max_new_tokens, jnp.int32) if row_max_new_tokens_B is None \
      else jnp.minimum(row_max_new_tokens_B, max_new_tokens)
  done_B = (limit_B <= 0) if active_B is None else (~active_B | (limit_B <= 0))
  segment_B1 = None if segment_B is None else segment_B[:, None]
  visible_from_B1 = None if visible_from_B is None else visible_from_B[:, None]
  zeros_BN = jnp.zeros((batch, max_new_tokens), jnp.float32)
  layer_params = unstack_layers(params) if config.decode_layers == "unrolled" else None
  init = _Decoding(state=state, key=key, step=jnp.zeros((), jnp.int32), done_B=done_B, out=Generation(
      tokens_BN=jnp.full((batch, max_new_tokens), PAD_ID, jnp.int32), lengths_B=jnp.zeros((batch,), jnp.int32),
      ended_by_eos_B=jnp.zeros((batch,), bool), ended_by_stop_B=jnp.zeros((batch,), bool),
      sampling_logp_BN=zeros_BN, model_logp_BN=zeros_BN))

  def cond(c: _Decoding):
    return (c.step < max_new_tokens) & ~jnp.all(c.done_B)

  def body(c: _Decoding) -> _Decoding:
    key, step_key = jax.random.split(c.key)
    token, slp, mlp = sample(step_key, c.state.logits_BV, rule)
    active = ~c.done_B
    token = jnp.where(active, token, PAD_ID)
    write = lambda out_BN, x_B: jax.lax.dynamic_update_slice(out_BN, x_B[:, None], (0, c.step))  # noqa: E731
    tokens = write(c.out.tokens_BN, token)
    n = c.out.lengths_B + active  # a row is active from step 0 until done, so its tokens are columns [0, n)
    eos = active & jnp.isin(token, eos_ids)
    stop = active & ~eos & _ends_with_stop(tokens, n, stops)
    out = Generation(tokens_BN=tokens, lengths_B=n, ended_by_eos_B=c.out.ended_by_eos_B | eos,
                     ended_by_stop_B=c.out.ended_by_stop_B | stop,
                     sampling_logp_BN=write(c.out.sampling_logp_BN, jnp.where(active, slp, 0.0)),
                     model_logp_BN=write(c.out.model_logp_BN, jnp.where(active, mlp, 0.0)))
    return _Decoding(
        state=_extend(config, params, c.state, token[:, None], active[:, None], segment_B1, visible_from_B1,
                      layer_params),
        key=key, step=c.step + 1, done_B=c.done_B | eos | stop | (n >= limit_B), out=out)

  final = jax.lax.while_loop(cond, body, init)
  return final.state, final.out
