"""The host rollout path: a Python loop over turns that calls the jitted sampler.

Each turn re-prefills the whole history from scratch (how RAGEN and most
frameworks roll out, and the baseline the device path is measured against).
It serves host-side text environments and, for the JAX environments, checks
the device path: with greedy decoding both give the same trajectories.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax.models.model import Model
from ragen_jax.rollout import prompt
from ragen_jax.rollout.episodes import (RolloutAssets, RolloutConfig, act, reasoning_length, render_batch,
                                        reset_batch, visible_from)
from ragen_jax.sampling import SamplingSession
from ragen_jax.trajectories import Trajectories


@dataclasses.dataclass
class EpisodeRecord:
  """One episode's packed token stream, grown turn by turn on the host."""

  tokens: list = dataclasses.field(default_factory=list)
  generated: list = dataclasses.field(default_factory=list)
  logp: list = dataclasses.field(default_factory=list)
  turn_of_token: list = dataclasses.field(default_factory=list)
  segment: list = dataclasses.field(default_factory=list)
  visible_from: list = dataclasses.field(default_factory=list)
  turn_end: list = dataclasses.field(default_factory=list)
  token_rewards: list = dataclasses.field(default_factory=list)
  response_start: list = dataclasses.field(default_factory=list)
  response_len: list = dataclasses.field(default_factory=list)
  reasoning_len: list = dataclasses.field(default_factory=list)
  turn_rewards: list = dataclasses.field(default_factory=list)
  format_ok: list = dataclasses.field(default_factory=list)
  num_actions: int = 0

  def add_prompt(self, ids, turn: int, window: int = 1, system_tokens: int = 0):
    """Appends a turn's prompt chunk; its first `system_tokens` are the system prompt."""
    self.tokens += list(ids)
    self.generated += [False] * len(ids)
    self.logp += [0.0] * len(ids)
    self.turn_of_token += [turn] * len(ids)
    self.segment += [0] * system_tokens + [turn + 1] * (len(ids) - system_tokens)
    self.visible_from += [window] * len(ids)
    self.turn_end += [False] * len(ids)
    self.token_rewards += [0.0] * len(ids)

  def turn_tokens(self, max_turns: int) -> np.ndarray:
    """int32[max_turns]: tokens of each turn so far, the system prompt not counted."""
    return np.bincount(np.asarray(self.segment, np.int64), minlength=max_turns + 1)[1:max_turns + 1].astype(np.int32)

  def add_reply(self, ids, logp, turn: int, reward: float, format_ok: bool, reasoning: int, num_actions: int):
    self.response_start.append(len(self.tokens) if len(ids) else -1)
    self.response_len.append(len(ids))
    self.reasoning_len.append(reasoning)
    self.turn_rewards.append(reward)
    self.format_ok.append(format_ok)
    self.num_actions += num_actions
    self.tokens += list(ids)
    self.generated += [True] * len(ids)
    self.logp += list(logp)
    self.turn_of_token += [turn] * len(ids)
    self.segment += [turn + 1] * len(ids)
    self.visible_from += [self.visible_from[-1]] * len(ids)
    self.turn_end += [i == len(ids) - 1 for i in range(len(ids))]
    self.token_rewards += [reward if i == len(ids) - 1 else 0.0 for i in range(len(ids))]


def assemble(records: list[EpisodeRecord], success, group_ids, seq_len: int, max_turns: int) -> Trajectories:
  """Packs host episode records into a Trajectories batch of sequence length `seq_len`."""
  batch = len(records)
  longest = max(len(r.tokens) for r in records)
  if longest > seq_len:
    raise ValueError(f"an episode has {longest} tokens, more than the sequence length {seq_len}")

  def per_token(field, dtype, fill=0):
    out = np.full((batch, seq_len), fill, dtype)
    for i, r in enumerate(records):
      out[i, :len(r.tokens)] = getattr(r, field)
    return out

  def per_turn(field, dtype, fill=0):
    out = np.full((batch, max_turns), fill, dtype)
    for i, r in enumerate(records):
      values = getattr(r, field)
      out[i, :len(values)] = values
    return out

  valid = np.zeros((batch, seq_len), bool)
  for i, r in enumerate(records):
    valid[i, :len(r.tokens)] = True
  generated = per_token("generated", bool, False)
  turn_rewards = per_turn("turn_rewards", np.float32)
  score = turn_rewards.sum(1)
  last = np.where(generated.any(1), seq_len - 1 - np.argmax(generated[:, ::-1], axis=1), -1)
  score_rewards = np.where(np.arange(seq_len)[None] == last[:, None], score[:, None], 0.0).astype(np.float32)
  return Trajectories(
      tokens=per_token("tokens", np.int32), valid=valid, loss_mask=generated,
      sample_logp=per_token("logp", np.float32), turn_of_token=per_token("turn_of_token", np.int32, -1),
      segment_ids=per_token("segment", np.int32), visible_from=per_token("visible_from", np.int32),
      turn_end=per_token("turn_end", bool, False), token_rewards=per_token("token_rewards", np.float32),
      score_rewards=score_rewards, response_start=per_turn("response_start", np.int32, -1),
      response_len=per_turn("response_len", np.int32), reasoning_len=per_turn("reasoning_len", np.int32),
      turn_rewards=turn_rewards, format_ok=per_turn("format_ok", bool, False), score=score,
      success=np.asarray(success, bool), num_turns=np.asarray([len(r.response_len) for r in records], np.int32),
      num_actions=np.asarray([r.num_actions for r in records], np.int32), group_ids=np.asarray(group_ids, np.int32))


_act = jax.jit(act, static_argnames=("env", "config"))
_first_chunks = jax.jit(jax.vmap(prompt.first_chunk, in_axes=(None, 0, 0, 0)))
_turn_chunks = jax.jit(jax.vmap(prompt.turn_chunk, in_axes=(None, 0, 0, None, 0, 0, 0)))
_reasoning_lengths = jax.jit(jax.vmap(reasoning_length, in_axes=(None, 0, 0)))


@functools.partial(jax.jit, static_argnums=(0,))
def _visible_from(config: RolloutConfig, turn, turn_tokens_BK, chunk_tokens_B, system_tokens):
  return jax.vmap(functools.partial(visible_from, config), in_axes=(None, 0, 0, None))(
      turn, turn_tokens_BK, chunk_tokens_B, system_tokens)


def context_windows(config: RolloutConfig, turn: int, records: list[EpisodeRecord], chunk_tokens,
                    system_tokens: int) -> np.ndarray:
  """int32[B]: each episode's `visible_from` for turn `turn` (see `episodes.visible_from`)."""
  turn_tokens = np.stack([r.turn_tokens(config.max_turns) for r in records])
  return np.asarray(_visible_from(config, turn, turn_tokens, np.asarray(chunk_tokens, np.int32), system_tokens))


def reprefill_policy(model: Model, config: RolloutConfig, assets: RolloutAssets):
  """The sampler as a host policy: every call prefills each whole history from scratch."""

  def policy(records, active, env_state, key):
    del env_state
    session = SamplingSession.for_replies(model, [r.tokens for r in records], config.max_new_tokens,
                                          [r.segment for r in records], [r.visible_from for r in records])
    return session.generate(config.max_new_tokens, config.rule, key=key, stop_sequences=assets.stop_sequences,
                            active=active)

  return policy


def host_rollout(policy, env, env_params, assets: RolloutAssets, config: RolloutConfig, seeds_B, group_ids_B,
                 key, seq_len: int) -> Trajectories:
  """Plays the episodes turn by turn from the host.

  `policy(records, active_B, env_state, key)` gets the `EpisodeRecord`s so far and returns a
  `sampling.Generation` (or an object with its fields) with one reply per row;
  `reprefill_policy` wraps the sampler.
  """
  seeds_B = jnp.asarray(seeds_B, jnp.int32)
  batch = seeds_B.shape[0]
  env_state = reset_batch(env, env_params, seeds_B)
  obs_ids, obs_len = render_batch(env, env_params, assets.observation, env_state)
  records = [EpisodeRecord() for _ in range(batch)]
  done = np.zeros(batch, bool)
  actions_left = np.full(batch, config.max_actions_per_traj, np.int32)
  reward, ended_by_eos = np.zeros(batch, np.float32), np.zeros(batch, bool)
  turn_keys = jax.random.split(key, config.max_turns)
  for turn in range(config.max_turns):
    if done.all():
      break
    if turn == 0:
      chunks, chunk_valid = _first_chunks(assets.turns, obs_ids, obs_len, jnp.asarray(actions_left))
    else:
      obs_ids, obs_len = render_batch(env, env_params, assets.observation, env_state)
      chunks, chunk_valid = _turn_chunks(assets.turns, obs_ids, obs_len, turn, jnp.asarray(reward),
                                         jnp.asarray(ended_by_eos), jnp.asarray(actions_left))
    chunks, chunk_valid = np.asarray(chunks), np.asarray(chunk_valid)
    system_tokens = assets.turns.system.max_tokens if turn == 0 else 0
    windows = context_windows(config, turn, records, chunk_valid.sum(1) - system_tokens,
                              assets.turns.system.max_tokens)
    for i in np.flatnonzero(~done):
      records[i].add_prompt(chunks[i][chunk_valid[i]], turn, int(windows[i]), system_tokens)
    sample_key, env_key = jax.random.split(turn_keys[turn])
    gen = policy(records, ~done, env_state, sample_key)
    outcome = _act(env, env_params, assets, config, env_key, env_state, jnp.asarray(gen.tokens_BN),
                   jnp.asarray(gen.lengths_B), jnp.asarray(~done), jnp.asarray(actions_left))
    think = np.asarray(_reasoning_lengths(assets.vocab, jnp.asarray(gen.tokens_BN), jnp.asarray(gen.lengths_B)))
    tokens, lengths, logp = (np.asarray(x) for x in (gen.tokens_BN, gen.lengths_B, gen.model_logp_BN))
    turn_reward, format_ok, executed = (np.asarray(x) for x in (outcome.reward, outcome.format_ok,
                                                                 outcome.num_actions))
    for i in np.flatnonzero(~done):
      records[i].add_reply(tokens[i, :lengths[i]].tolist(), logp[i, :lengths[i]].tolist(), turn,
                           float(turn_reward[i]), bool(format_ok[i]), int(think[i]), int(executed[i]))
    env_state = outcome.env_state
    reward, ended_by_eos = turn_reward, np.asarray(gen.ended_by_eos_B)
    actions_left, done = np.asarray(outcome.actions_left), np.asarray(outcome.done)
  return assemble(records, np.asarray(env_state.success), np.asarray(group_ids_B), seq_len, config.max_turns)
