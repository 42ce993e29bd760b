"""Host-side front end of the sampler: padding, cache sizing, overflow checks."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np

from ragen_jax import mesh as mesh_lib
from ragen_jax.models.model import Model, put_batch
from ragen_jax.sampling.rules import SamplingRule
from ragen_jax.sampling.sampler import (PAD_ID, CacheOverflowError, Generation, SamplerState, decode, extend,
                                        prefill, stop_sequence_array)


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def pad_batch(rows: Sequence[Sequence[int]], side: str = "left", multiple: int = 8, longest: int = 0):
  """(tokens int32[B, T], valid bool[B, T]) with T the longest row (or `longest` when longer) rounded up to
  `multiple` (fewer recompiles)."""
  width = round_up(max(1, longest, max(len(r) for r in rows)), multiple)
  tokens = np.full((len(rows), width), PAD_ID, np.int32)
  valid = np.zeros((len(rows), width), bool)
  for i, row in enumerate(rows):
    sl = slice(width - len(row), width) if side == "left" else slice(0, len(row))
    tokens[i, sl] = row
    valid[i, sl] = True
  return tokens, valid


@dataclasses.dataclass
class SamplingSession:
  """A batch of conversations on one KV cache: start, generate, append, generate, ...

  The host tracks how many cache slots are used, so an overflow fails clearly
  before anything is compiled or run. With several processes each passes the rows
  of the batch its devices hold (`mesh.process_rows`) and every call is made by all
  of them; the generations are global arrays (`mesh.local_rows` reads a process's rows).
  """

  model: Model
  state: SamplerState
  max_len: int
  used: int
  reply_segment: np.ndarray | None = None       # int32[B], segment of generated tokens
  reply_visible_from: np.ndarray | None = None  # int32[B], their context window

  @classmethod
  def start(cls, model: Model, prompts: Sequence[Sequence[int]], max_len: int, segments=None,
            visible_from=None) -> SamplingSession:
    """Prefills the prompts. `segments` / `visible_from` (per-token lists like `prompts`)
    restrict each token's context (see `models.transformer`); replies continue the
    segment and window of their prompt's last token."""
    longest = mesh_lib.process_max(max(len(p) for p in prompts))  # all processes pad to the same width
    tokens, valid = pad_batch(prompts, longest=longest)
    if tokens.shape[1] > max_len:
      raise CacheOverflowError(f"prompts need {tokens.shape[1]} cache slots, the cache has {max_len}")
    context = () if segments is None else tuple(pad_batch(x, longest=longest)[0] for x in (segments, visible_from))
    with jax.set_mesh(model.mesh):
      put = functools.partial(put_batch, model.mesh)
      state = prefill(model.config, model.params, put(tokens), put(valid), max_len, *map(put, context))
    reply_segment, reply_visible_from = (x[:, -1] for x in context) if context else (None, None)
    return cls(model=model, state=state, max_len=max_len, used=tokens.shape[1], reply_segment=reply_segment,
               reply_visible_from=reply_visible_from)

  @classmethod
  def for_replies(cls, model: Model, prompts: Sequence[Sequence[int]], max_new_tokens: int, segments=None,
                  visible_from=None) -> SamplingSession:
    """A session whose cache holds the (padded) prompts plus `max_new_tokens` replies."""
    longest = mesh_lib.process_max(max(len(p) for p in prompts))
    return cls.start(model, prompts, round_up(longest, 8) + max_new_tokens, segments, visible_from)

  def _check_room(self, needed: int):
    if self.used + needed > self.max_len:
      raise CacheOverflowError(
          f"the KV cache has {self.max_len - self.used} free slots of {self.max_len}, {needed} are needed; "
          "start a larger session or truncate the history (context modes re-prefill)")

  def append(self, chunks: Sequence[Sequence[int]]):
    """Appends one chunk of tokens per row (right-padded) to the conversations."""
    tokens, valid = pad_batch(chunks, side="right", longest=mesh_lib.process_max(max(len(c) for c in chunks)))
    self._check_room(tokens.shape[1])
    with jax.set_mesh(self.model.mesh):
      self.state = extend(self.model.config, self.model.params, self.state, put_batch(self.model.mesh, tokens),
                          put_batch(self.model.mesh, valid))
    self.used += tokens.shape[1]

  def generate(self, max_new_tokens: int, rule: SamplingRule = SamplingRule(temperature=0.0),
               stop_sequences=(), key=None, row_max_new_tokens=None, active=None) -> Generation:
    """Samples a reply for every (active) row and keeps it in the cache.

    `stop_sequences` are token-id lists or an array from `stop_sequence_array`.
    """
    self._check_room(max_new_tokens)
    key = jax.random.key(0) if key is None else key
    stops = stop_sequences if hasattr(stop_sequences, "shape") else stop_sequence_array(stop_sequences)
    put = lambda x, dtype: None if x is None else put_batch(self.model.mesh, np.asarray(x, dtype))  # noqa: E731
    with jax.set_mesh(self.model.mesh):
      self.state, generation = decode(self.model.config, self.model.params, self.state, key, rule=rule,
                                      max_new_tokens=max_new_tokens,
                                      row_max_new_tokens_B=put(row_max_new_tokens, np.int32),
                                      stop_sequences_ML=stops, active_B=put(active, bool),
                                      segment_B=put(self.reply_segment, np.int32),
                                      visible_from_B=put(self.reply_visible_from, np.int32))
    self.used += max_new_tokens
    return generation


def generate(model: Model, prompts: Sequence[Sequence[int]], max_new_tokens, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0, stop_sequences=(), seed: int = 0) -> list[list[int]]:
  """Generates a continuation of every prompt (token-id lists).

  `max_new_tokens` is an int or one int per prompt. Returns token-id lists with
  a matched stop sequence included and EOS excluded.
  """
  rows = np.broadcast_to(np.asarray(max_new_tokens, np.int32), (len(prompts),))
  budget = int(rows.max())
  session = SamplingSession.for_replies(model, prompts, budget)
  rule = SamplingRule(temperature=temperature, top_k=top_k, top_p=top_p)
  out = session.generate(budget, rule, stop_sequences, jax.random.key(seed), row_max_new_tokens=rows)
  tokens, lengths, eos = (np.asarray(x) for x in (out.tokens_BN, out.lengths_B, out.ended_by_eos_B))
  return [tokens[i, :lengths[i] - int(eos[i])].tolist() for i in range(len(prompts))]
