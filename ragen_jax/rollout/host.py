"""The host rollout path: a Python loop over turns that calls the jitted sampler.

Each turn re-prefills the whole history from scratch (how RAGEN and most
frameworks roll out, and the baseline the device path is measured against).
It serves host-side text environments and, for the JAX environments, checks
the device path: with greedy decoding both give the same trajectories. Both
paths write through the same `trajectories.TrajectoryWriter`; here each episode's
tokens go at its own length so far.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import mesh as mesh_lib
from ragen_jax.models.model import Model
from ragen_jax.rollout import prompt
from ragen_jax.rollout.episodes import (RolloutAssets, RolloutConfig, act, reasoning_lengths, render_batch,
                                        reset_batch, visible_from)
from ragen_jax.sampling import SamplingSession
from ragen_jax.trajectories import Trajectories, TrajectoryWriter

_act = jax.jit(act, static_argnames=("env", "config"))
_first_chunks = jax.jit(jax.vmap(prompt.first_chunk, in_axes=(None, 0, 0, 0)))
_turn_chunks = jax.jit(jax.vmap(prompt.turn_chunk, in_axes=(None, 0, 0, None, 0, 0, 0)))


@functools.partial(jax.jit, static_argnums=(0,))
def _visible_from(config: RolloutConfig, turn, writer: TrajectoryWriter, chunk_tokens_B, system_tokens):
  return jax.vmap(functools.partial(visible_from, config), in_axes=(None, 0, 0, None))(
      turn, writer.turn_tokens(), chunk_tokens_B, system_tokens)


def context_windows(config: RolloutConfig, turn: int, writer: TrajectoryWriter, chunk_tokens,
                    system_tokens: int) -> np.ndarray:
  """int32[B]: each episode's `visible_from` for turn `turn` (see `episodes.visible_from`)."""
  return np.asarray(_visible_from(config, turn, writer, np.asarray(chunk_tokens, np.int32), system_tokens))


def next_offsets(writer: TrajectoryWriter, added_B, seq_len: int) -> np.ndarray:
  """int32[B]: each episode's length, where its next tokens go; raises ValueError first when
  `added_B` more tokens would take an episode past `seq_len`."""
  lengths = np.asarray(jnp.sum(writer.slots.valid, axis=1), np.int32)
  longest = int(np.max(lengths + np.asarray(added_B)))
  if longest > seq_len:
    raise ValueError(f"an episode has {longest} tokens, more than the sequence length {seq_len}")
  return lengths


def reprefill(model: Model, config: RolloutConfig, writer: TrajectoryWriter, stop_sequences, key, active_B):
  """Samples a reply for each active episode, prefilling each whole history in `writer` from scratch; the
  `sampling.Generation` on the host. With several processes each passes its own rows (`mesh.process_rows`) and
  gets their replies."""
  valid, tokens, segment, window = jax.device_get((writer.slots.valid, writer.slots.tokens,
                                                   writer.slots.segment_ids, writer.slots.visible_from))
  history = lambda x: [row[row_valid] for row, row_valid in zip(x, valid)]  # noqa: E731
  session = SamplingSession.for_replies(model, history(tokens), config.max_new_tokens, history(segment),
                                        history(window))
  gen = session.generate(config.max_new_tokens, config.rule, key=key, stop_sequences=stop_sequences, active=active_B)
  return jax.tree.map(mesh_lib.local_rows, gen)


def reprefill_policy(model: Model, config: RolloutConfig, assets: RolloutAssets):
  """The sampler as a host policy: every call prefills each whole history from scratch."""

  def policy(writer, active, env_state, key):
    del env_state
    return reprefill(model, config, writer, assets.stop_sequences, key, active)

  return policy


def host_rollout(policy, env, env_params, assets: RolloutAssets, config: RolloutConfig, seeds_B, group_ids_B,
                 key, seq_len: int) -> Trajectories:
  """Plays the episodes turn by turn from the host.

  `policy(writer, active_B, env_state, key)` gets the `TrajectoryWriter` so far (each episode's
  tokens packed from slot 0) and returns a `sampling.Generation` (or an object with its fields)
  with one reply per row; `reprefill_policy` wraps the sampler.
  """
  seeds_B = jnp.asarray(seeds_B, jnp.int32)
  batch = seeds_B.shape[0]
  env_state = reset_batch(env, env_params, seeds_B)
  obs_ids, obs_len = render_batch(env, env_params, assets.observation, env_state)
  writer = TrajectoryWriter.empty(batch, seq_len, config.max_turns)
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
    chunk_valid = np.asarray(chunk_valid) & ~done[:, None]
    system_tokens = assets.turns.system.max_tokens
    windows = context_windows(config, turn, writer, chunk_valid.sum(1) - (system_tokens if turn == 0 else 0),
                              system_tokens)
    writer = writer.write_chunk(next_offsets(writer, chunk_valid.sum(1), seq_len), turn, chunks, chunk_valid,
                                prompt.chunk_segments(system_tokens, chunk_valid.shape[1], turn), windows)
    sample_key, env_key = jax.random.split(turn_keys[turn])
    gen = policy(writer, ~done, env_state, sample_key)
    outcome = _act(env, env_params, assets, config, env_key, env_state, jnp.asarray(gen.tokens_BN),
                   jnp.asarray(gen.lengths_B), jnp.asarray(~done), jnp.asarray(actions_left))
    reasoning_B = reasoning_lengths(assets.vocab, gen.tokens_BN, gen.lengths_B, config.enable_think)
    writer = writer.write_reply(next_offsets(writer, np.where(done, 0, gen.lengths_B), seq_len), turn, ~done,
                                gen.tokens_BN, gen.lengths_B, gen.model_logp_BN, windows, outcome.reward,
                                outcome.format_ok, reasoning_B, outcome.num_actions)
    env_state = outcome.env_state
    reward, ended_by_eos = np.asarray(outcome.reward), np.asarray(gen.ended_by_eos_B)
    actions_left, done = np.asarray(outcome.actions_left), np.asarray(outcome.done)
  return jax.device_get(writer.finish(env_state.success, group_ids_B))
