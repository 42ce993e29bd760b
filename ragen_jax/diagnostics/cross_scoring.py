"""Cross-scoring for the MI proxies (SPEC §5): log p(z_r | x_j) for R reasonings × N prompts.

A turn k of episode b is a (prompt, reasoning) pair read off the packed batch:
the prompt X is `tokens[b, :s]` with s = response_start[b, k] (it ends with
the opening `<think>`), the reasoning Z is the next reasoning_len[b, k] tokens: the
reasoning of the answer grammar (`envs.text`), up to the `</think>` right before the
answer block. Turns without a well-formed answer or with empty reasoning have no pair.

Rows are sampled reasonings, columns are prompts; both are (episode, turn)
indices, so every shape is static and padding rows are masked, never dropped.

The scorer prefills each distinct column prompt once into a KV cache (layers
only, no LM head), copies that cache for a chunk of rows and appends the rows'
reasoning tokens teacher-forced, `block_tokens` at a time, in a
`lax.while_loop` that stops at the longest reasoning of the chunk (rows are
sorted by length, so short chunks stop early). Each block's logits are reduced
to the target tokens' log-probs at once, so memory holds one block of logits.
Cost: (distinct prompts × prompt tokens) layer passes plus (R × N × reasoning
tokens) full passes, against R × N × (prompt + reasoning) for scoring every
pair as its own sequence.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.partitioning import constrain
from ragen_jax.models.transformer import KVCache, Transformer
from ragen_jax.trajectories import Trajectories


@flax.struct.dataclass
class CrossPairs:
  """Which turns are rows (reasonings) and columns (prompts) of one cross-scoring matrix.

  row_episode, row_turn: int32[R]; row_mask: bool[R] rows that hold a real sample.
  col_episode, col_turn: int32[N]; own_col: int32[R] the column of each row's own prompt.
  """

  row_episode: jax.Array
  row_turn: jax.Array
  row_mask: jax.Array
  col_episode: jax.Array
  col_turn: jax.Array
  own_col: jax.Array


def has_reasoning(batch: Trajectories) -> jax.Array:
  """bool[B, K]: the turn exists and has non-empty reasoning under the answer grammar."""
  return (batch.response_start >= 0) & (batch.reasoning_len > 0)


def eligible_turns(batch: Trajectories, prompt_window: int) -> jax.Array:
  """bool[B, K]: turns with reasoning whose prompt fits in the first `prompt_window` tokens."""
  return has_reasoning(batch) & (batch.response_start >= 1) & (batch.response_start <= prompt_window)


def reasoning_token_mask(batch: Trajectories) -> jax.Array:
  """bool[B, T]: the reasoning tokens of every turn (the answer grammar's `<think> … </think>`)."""
  turn_BT = jnp.maximum(batch.turn_of_token, 0)
  start_BT = jnp.take_along_axis(batch.response_start, turn_BT, axis=1)
  length_BT = jnp.take_along_axis(batch.reasoning_len, turn_BT, axis=1)
  offset_BT = jnp.arange(batch.seq_len)[None, :] - start_BT
  return batch.loss_mask & (start_BT >= 0) & (offset_BT >= 0) & (offset_BT < length_BT)


def _at_turn(per_turn_BK: jax.Array, episode_R: jax.Array, turn_R: jax.Array) -> jax.Array:
  return per_turn_BK[episode_R, turn_R]


def gather_reasoning(values_BT: jax.Array, batch: Trajectories, episode_R: jax.Array, turn_R: jax.Array,
                     max_tokens: int) -> tuple[jax.Array, jax.Array]:
  """The first `max_tokens` reasoning entries of `values_BT` (e.g. tokens, log-probs) per row.

  Returns (values [R, max_tokens], zero past each row's length; lengths int32[R],
  the reasoning length capped at `max_tokens`).
  """
  start_R = jnp.maximum(_at_turn(batch.response_start, episode_R, turn_R), 0)
  length_R = jnp.minimum(_at_turn(batch.reasoning_len, episode_R, turn_R), max_tokens).astype(jnp.int32)
  index_RZ = jnp.minimum(start_R[:, None] + jnp.arange(max_tokens), batch.seq_len - 1)
  gathered_RZ = jnp.take_along_axis(values_BT[episode_R], index_RZ, axis=1)
  inside_RZ = jnp.arange(max_tokens)[None, :] < length_R[:, None]
  return jnp.where(inside_RZ, gathered_RZ, jnp.zeros((), values_BT.dtype)), length_R


def gather_prompts(batch: Trajectories, episode_N: jax.Array, turn_N: jax.Array,
                   prompt_window: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(prompts int32[N, prompt_window]: the first tokens of each column's episode,
  prompt_len int32[N]: how many of them form the prompt, `<think>` included; a
  prompt longer than the window is cut to it, see `eligible_turns`; their
  segment_ids and visible_from int32[N, prompt_window])."""
  if not 1 <= prompt_window <= batch.seq_len:
    raise ValueError(f"prompt window must be in [1, seq_len={batch.seq_len}], got {prompt_window}")
  prompt_len_N = jnp.clip(_at_turn(batch.response_start, episode_N, turn_N), 1, prompt_window).astype(jnp.int32)
  window = lambda x_BT: x_BT[episode_N, :prompt_window]  # noqa: E731
  return window(batch.tokens), prompt_len_N, window(batch.segment_ids), window(batch.visible_from)


def prompt_equivalence(batch: Trajectories, pairs: CrossPairs) -> jax.Array:
  """bool[N, N]: columns whose prompts are the same token sequence."""
  tokens_NT = batch.tokens[pairs.col_episode]
  length_N = _at_turn(batch.response_start, pairs.col_episode, pairs.col_turn)
  in_prompt_NT = jnp.arange(batch.seq_len)[None, :] < length_N[:, None]
  same_tokens_NN = jnp.all((tokens_NT[:, None] == tokens_NT[None]) | ~in_prompt_NT[:, None], axis=-1)
  return same_tokens_NN & (length_N[:, None] == length_N[None])


def first_turn_pairs(batch: Trajectories, num_groups: int, num_rows: int, key: jax.Array,
                     prompt_window: int) -> CrossPairs:
  """First turns only: up to `num_rows` episodes drawn without replacement among those
  with first-turn reasoning; the columns are the env groups (each group's first episode
  stands for the group: all its episodes share the first prompt)."""
  if num_rows > batch.batch_size:
    raise ValueError(f"first-turn sampling draws without replacement: {num_rows} rows > {batch.batch_size} episodes")
  eligible_B = eligible_turns(batch, prompt_window)[:, 0]
  priority_B = jax.random.uniform(key, eligible_B.shape) + jnp.where(eligible_B, 0.0, 2.0)
  episode_R = jnp.argsort(priority_B)[:num_rows].astype(jnp.int32)
  group_first_episode_G = jnp.argmax(batch.group_ids[None, :] == jnp.arange(num_groups)[:, None], axis=1)
  return CrossPairs(row_episode=episode_R, row_turn=jnp.zeros_like(episode_R),
                    row_mask=jnp.arange(num_rows) < jnp.sum(eligible_B),
                    col_episode=group_first_episode_G.astype(jnp.int32),
                    col_turn=jnp.zeros((num_groups,), jnp.int32),
                    own_col=batch.group_ids[episode_R].astype(jnp.int32))


def trajectory_pairs(batch: Trajectories, num_rows: int, key: jax.Array, prompt_window: int) -> CrossPairs:
  """`num_rows` draws with replacement: an episode uniformly among those with any
  eligible turn, then one of its eligible turns uniformly; each draw is its own column."""
  eligible_BK = eligible_turns(batch, prompt_window)
  eligible_B = jnp.any(eligible_BK, axis=1)
  any_eligible = jnp.any(eligible_B)
  episode_key, turn_key = jax.random.split(key)
  episode_logits_B = jnp.where(eligible_B | ~any_eligible, 0.0, -jnp.inf)
  episode_R = jax.random.categorical(episode_key, episode_logits_B, shape=(num_rows,)).astype(jnp.int32)
  turn_logits_RK = jnp.where(eligible_BK[episode_R] | ~any_eligible, 0.0, -jnp.inf)
  turn_R = jax.random.categorical(turn_key, turn_logits_RK, axis=1).astype(jnp.int32)
  return CrossPairs(row_episode=episode_R, row_turn=turn_R, row_mask=jnp.full((num_rows,), any_eligible),
                    col_episode=episode_R, col_turn=turn_R, own_col=jnp.arange(num_rows, dtype=jnp.int32))


def _pad_rows(x: jax.Array, multiple: int, fill=0) -> jax.Array:
  extra = -x.shape[0] % multiple
  return jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1), constant_values=fill)


def _repeat_cache(cache: KVCache, times: int) -> KVCache:
  """Each row of `cache` repeated `times` times in a row (row-major pairs)."""
  axes = KVCache.KV_AXES
  return KVCache(k=constrain(jnp.repeat(cache.k, times, axis=1), axes),
                 v=constrain(jnp.repeat(cache.v, times, axis=1), axes),
                 valid=jnp.repeat(cache.valid, times, axis=0), segment=jnp.repeat(cache.segment, times, axis=0),
                 end=cache.end)


def cross_logp(config: ModelConfig, params, prompts_NP: jax.Array, prompt_len_N: jax.Array,
               reasoning_RZ: jax.Array, reasoning_len_R: jax.Array, *, num_columns: jax.Array | None = None,
               block_tokens: int = 16, columns_per_step: int = 8, rows_per_step: int | None = 16,
               prompt_segments_NP: jax.Array | None = None, prompt_visible_from_NP: jax.Array | None = None
               ) -> jax.Array:
  """Summed teacher-forced log-probs float32[R, N]: S[r, j] = Σ_i log p(z_r[i] | x_j, z_r[<i]).

  prompts_NP: int32[N, P] with prompt_len_N real tokens each (the prompt is the
  first prompt_len tokens, ≥ 1); reasoning_RZ: int32[R, Z] with reasoning_len_R
  real tokens each (≤ Z). Only the first `num_columns` (traced; default N) columns
  are scored, the rest are 0. Work is split into steps of `columns_per_step`
  prompts × `rows_per_step` rows (None: all) run one after another; with the pair
  axis sharded over data × fsdp, a step of C prompts keeps each prompt's copies on the
  device that prefilled it when C is a multiple of the batch shards. prompt_segments_NP /
  prompt_visible_from_NP: the prompts' context windows (see `models.transformer`); the
  reasoning continues the window of its column's last prompt token.
  """
  num_cols, window = prompts_NP.shape
  num_rows, max_tokens = reasoning_RZ.shape
  if min(block_tokens, columns_per_step, rows_per_step or 1) < 1:
    raise ValueError("block_tokens, columns_per_step and rows_per_step must be positive")
  rows_per_step, columns_per_step = min(rows_per_step or num_rows, num_rows), min(columns_per_step, num_cols)
  if reasoning_len_R.shape != (num_rows,) or prompt_len_N.shape != (num_cols,):
    raise ValueError(f"lengths must be [R={num_rows}] and [N={num_cols}], got {reasoning_len_R.shape}, "
                     f"{prompt_len_N.shape}")
  padded_tokens = math.ceil(max_tokens / block_tokens) * block_tokens
  module = Transformer(config)

  # Column c holds its prompt minus the last token; every row's input starts with that
  # token, so input i predicts reasoning token i.
  at_last = lambda x_NP: jnp.take_along_axis(x_NP, (prompt_len_N - 1)[:, None], axis=1)[:, 0]  # noqa: E731
  if prompt_segments_NP is None:
    prompt_segments_NP = prompt_visible_from_NP = jnp.zeros_like(prompts_NP)
  last_N = at_last(prompts_NP)
  prefill_valid_NP = jnp.arange(window)[None, :] < (prompt_len_N - 1)[:, None]
  targets_RZ = jnp.pad(reasoning_RZ, ((0, 0), (0, padded_tokens - max_tokens)))
  order_R = jnp.argsort(-reasoning_len_R, stable=True)  # long rows first: chunks of similar length
  row_chunks = jax.tree.map(lambda x: _pad_rows(x, rows_per_step).reshape(-1, rows_per_step, *x.shape[1:]),
                            (targets_RZ[order_R], reasoning_len_R[order_R]))
  col_chunks = jax.tree.map(lambda x: _pad_rows(x, columns_per_step).reshape(-1, columns_per_step, *x.shape[1:]),
                            (prompts_NP, prefill_valid_NP, prompt_segments_NP, prompt_visible_from_NP, last_N,
                             at_last(prompt_segments_NP), at_last(prompt_visible_from_NP)))

  def score_rows(prompt_cache: KVCache, last_C, segment_C, visible_from_C, targets_CrZ, length_Cr):
    pairs = columns_per_step * rows_per_step
    cache = _repeat_cache(prompt_cache, rows_per_step)
    targets_QZ = jnp.tile(targets_CrZ, (columns_per_step, 1))
    inputs_QZ = jnp.concatenate([jnp.repeat(last_C, rows_per_step)[:, None], targets_QZ[:, :-1]], axis=1)
    segment_QK, visible_from_QK = (jnp.broadcast_to(jnp.repeat(x, rows_per_step)[:, None], (pairs, block_tokens))
                                   for x in (segment_C, visible_from_C))
    length_Q = jnp.tile(length_Cr, columns_per_step)
    num_blocks = (jnp.max(length_Cr) + block_tokens - 1) // block_tokens

    def block(carry):
      index, cache, total_Q = carry
      start = index * block_tokens
      inputs_QK = jax.lax.dynamic_slice_in_dim(inputs_QZ, start, block_tokens, axis=1)
      targets_QK = jax.lax.dynamic_slice_in_dim(targets_QZ, start, block_tokens, axis=1)
      valid_QK = (start + jnp.arange(block_tokens))[None, :] < length_Q[:, None]
      hidden, cache = module.apply({"params": params}, inputs_QK, valid_QK, cache, segment_BT=segment_QK,
                                   visible_from_BT=visible_from_QK)
      logits_QKV = module.apply({"params": params}, hidden, method="lm_logits")
      target_logits_QK = jnp.take_along_axis(logits_QKV, targets_QK[..., None], axis=-1)[..., 0]
      logp_QK = target_logits_QK - jax.nn.logsumexp(logits_QKV, axis=-1)
      return index + 1, cache, total_Q + jnp.sum(jnp.where(valid_QK, logp_QK, 0.0), axis=1)

    init = (jnp.zeros((), jnp.int32), cache, jnp.zeros((pairs,), jnp.float32))
    _, _, total_Q = jax.lax.while_loop(lambda c: c[0] < num_blocks, block, init)
    return total_Q.reshape(columns_per_step, rows_per_step)

  def score_columns(prompts_CP, valid_CP, segments_CP, visible_from_CP, *last_token_C):
    empty = KVCache.zeros(config, columns_per_step, window + padded_tokens)
    _, prompt_cache = module.apply({"params": params}, prompts_CP, valid_CP, empty, segment_BT=segments_CP,
                                   visible_from_BT=visible_from_CP)
    return jax.lax.map(lambda rows: score_rows(prompt_cache, *last_token_C, *rows), row_chunks)  # [row chunks, C, Cr]

  def score_chunk(index_and_chunk):
    index, chunk = index_and_chunk
    skipped = jnp.zeros((row_chunks[1].shape[0], columns_per_step, rows_per_step), jnp.float32)
    active = index * columns_per_step < (num_cols if num_columns is None else num_columns)
    return jax.lax.cond(active, score_columns, lambda *_: skipped, *chunk)

  num_chunks = col_chunks[0].shape[0]
  scores = jax.lax.map(score_chunk, (jnp.arange(num_chunks), col_chunks))  # [col chunks, row chunks, C, Cr]
  sorted_NR = scores.transpose(0, 2, 1, 3).reshape(-1, scores.shape[1] * rows_per_step)[:num_cols, :num_rows]
  return jnp.zeros((num_rows, num_cols), jnp.float32).at[order_R].set(sorted_NR.T)


def score_pairs(config: ModelConfig, params, batch: Trajectories, pairs: CrossPairs, *, max_reasoning_tokens: int,
                prompt_window: int, block_tokens: int = 16, columns_per_step: int = 8,
                rows_per_step: int | None = 16) -> tuple[jax.Array, jax.Array]:
  """(S float32[R, N] summed reasoning log-probs under the current policy, lengths int32[R]).

  Reasonings are cut to their first `max_reasoning_tokens` tokens; padding rows get
  length 0 and S = 0. Columns with the same prompt (e.g. trajectory draws of first
  turns of one group) are scored once and copied.
  """
  reasoning_RZ, length_R = gather_reasoning(batch.tokens, batch, pairs.row_episode, pairs.row_turn,
                                            max_reasoning_tokens)
  length_R = jnp.where(pairs.row_mask, length_R, 0)
  # Each column's representative is the first column with its prompt; representatives go first.
  representative_N = jnp.argmax(prompt_equivalence(batch, pairs), axis=0)
  distinct_N = representative_N == jnp.arange(representative_N.shape[0])
  order_N = jnp.argsort(~distinct_N, stable=True)
  slot_N = jnp.argsort(order_N)  # where each column went in `order_N`
  prompts_NP, prompt_len_N, segments_NP, visible_from_NP = gather_prompts(
      batch, pairs.col_episode[order_N], pairs.col_turn[order_N], prompt_window)
  distinct_logp_RN = cross_logp(config, params, prompts_NP, prompt_len_N, reasoning_RZ, length_R,
                                num_columns=jnp.sum(distinct_N), block_tokens=block_tokens,
                                columns_per_step=columns_per_step, rows_per_step=rows_per_step,
                                prompt_segments_NP=segments_NP, prompt_visible_from_NP=visible_from_NP)
  return distinct_logp_RN[:, slot_N[representative_N]], length_R
