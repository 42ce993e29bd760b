"""The device rollout path: whole multi-turn episodes inside one jit.

Turns run in `lax.scan`; each turn renders the observation to tokens, appends it
to the KV cache (no re-prefill of the history), samples the reply, parses the
answer and steps the environments, all vmapped over the batch of episodes.
Every token lives in a fixed slot of the cache, so shapes are static; slots a
row does not use are holes that attention skips, and the result is packed.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.partitioning import constrain
from ragen_jax.rollout import prompt
from ragen_jax.rollout.episodes import (RolloutAssets, RolloutConfig, act, reasoning_lengths, render_batch,
                                        reset_batch, visible_from)
from ragen_jax.sampling import SamplerState, decode, extend, prefill
from ragen_jax.trajectories import Trajectories, TrajectoryWriter


def slot_layout(assets: RolloutAssets, config: RolloutConfig) -> tuple[int, int, int]:
  """(first chunk length C0, later chunk length C, total slots S) of a rollout."""
  obs, turns = assets.observation.max_tokens, assets.turns
  first = turns.system.max_tokens + turns.first.max_tokens + obs + turns.tail.max_tokens
  later = turns.head.max_tokens + obs + turns.tail.max_tokens
  return first, later, first + config.max_new_tokens + (config.max_turns - 1) * (later + config.max_new_tokens)


@flax.struct.dataclass
class _Episodes:
  """The turn loop's carry: sampler, environments and what is written so far."""

  sampler: SamplerState
  env_state: object
  writer: TrajectoryWriter
  done: jax.Array          # bool[B]
  actions_left: jax.Array  # int32[B]
  reward: jax.Array        # float32[B] of the last turn
  ended_by_eos: jax.Array  # bool[B] the last reply ended with EOS
  window: jax.Array        # int32[B] the current turn's visible_from


def device_rollout(model_config: ModelConfig, params, env, env_params, assets: RolloutAssets, config: RolloutConfig,
                   seeds_B, group_ids_B, key) -> Trajectories:
  """Plays B episodes (env seeds `seeds_B`) to the end on device and returns them packed.

  The reset is a jit of its own, so rollouts of other models or settings reuse its compilation.
  """
  return play_episodes(model_config, params, env, env_params, assets, config, reset_batch(env, env_params, seeds_B),
                       group_ids_B, key)


@functools.partial(jax.jit, static_argnames=("model_config", "env", "config"))
def play_episodes(model_config: ModelConfig, params, env, env_params, assets: RolloutAssets, config: RolloutConfig,
                  env_state_B, group_ids_B, key) -> Trajectories:
  """Plays B episodes from their first env states to the end on device and returns them packed."""
  batch, n_new, n_turns = group_ids_B.shape[0], config.max_new_tokens, config.max_turns
  first_len, chunk_len, n_slots = slot_layout(assets, config)
  render = functools.partial(render_batch, env, env_params, assets.observation)

  obs_ids, obs_len = render(env_state_B)
  actions_left = jnp.full((batch,), config.max_actions_per_traj, jnp.int32)
  chunk, chunk_valid = jax.vmap(prompt.first_chunk, in_axes=(None, 0, 0, 0))(assets.turns, obs_ids, obs_len,
                                                                          actions_left)
  writer = TrajectoryWriter.empty(batch, n_slots, n_turns)
  writer = writer.replace(slots=jax.tree.map(lambda x: constrain(x, ("batch", None)), writer.slots))
  system_tokens = assets.turns.system.max_tokens
  windows = jax.vmap(functools.partial(visible_from, config), in_axes=(None, 0, 0, None))
  window = windows(0, writer.turn_tokens(), jnp.sum(chunk_valid, axis=1) - system_tokens, system_tokens)
  segment = jnp.broadcast_to(prompt.chunk_segments(system_tokens, first_len, 0), chunk.shape)
  window_BT = jnp.broadcast_to(window[:, None], chunk.shape)
  carry = _Episodes(
      sampler=prefill(model_config, params, chunk, chunk_valid, n_slots, segment, window_BT), env_state=env_state_B,
      writer=writer.write_chunk(0, 0, chunk, chunk_valid, segment, window), done=jnp.zeros((batch,), bool),
      actions_left=actions_left, reward=jnp.zeros((batch,), jnp.float32), ended_by_eos=jnp.zeros((batch,), bool),
      window=window)

  def play_turn(c: _Episodes, turn, offset, turn_key) -> _Episodes:
    active = ~c.done
    sample_key, env_key = jax.random.split(turn_key)
    sampler, gen = decode(model_config, params, c.sampler, sample_key, rule=config.rule, max_new_tokens=n_new,
                          stop_sequences_ML=assets.stop_sequences, active_B=active,
                          segment_B=jnp.full((batch,), turn + 1, jnp.int32), visible_from_B=c.window)
    outcome = act(env, env_params, assets, config, env_key, c.env_state, gen.tokens_BN, gen.lengths_B, active,
                  c.actions_left)
    reasoning_B = reasoning_lengths(assets.vocab, gen.tokens_BN, gen.lengths_B, config.enable_think)
    writer = c.writer.write_reply(offset, turn, active, gen.tokens_BN, gen.lengths_B, gen.model_logp_BN, c.window,
                                  outcome.reward, outcome.format_ok, reasoning_B, outcome.num_actions)
    return c.replace(sampler=sampler, env_state=outcome.env_state, writer=writer, done=outcome.done,
                     actions_left=outcome.actions_left, reward=outcome.reward, ended_by_eos=gen.ended_by_eos_B)

  def next_chunk(c: _Episodes, turn, offset) -> _Episodes:
    """Appends turn `turn`'s prompt chunk (observation, reward, reminders) before its reply at `offset`."""
    obs_ids, obs_len = render(c.env_state)
    chunk, chunk_valid = jax.vmap(prompt.turn_chunk, in_axes=(None, 0, 0, None, 0, 0, 0))(
        assets.turns, obs_ids, obs_len, turn, c.reward, c.ended_by_eos, c.actions_left)
    chunk_valid &= ~c.done[:, None]
    window = windows(turn, c.writer.turn_tokens(), jnp.sum(chunk_valid, axis=1), system_tokens)
    segment = jnp.where(chunk_valid, turn + 1, 0)
    window_BT = jnp.where(chunk_valid, window[:, None], 0)
    return c.replace(sampler=extend(model_config, params, c.sampler, chunk, chunk_valid, segment, window_BT),
                     writer=c.writer.write_chunk(offset - chunk_len, turn, chunk, chunk_valid, segment, window),
                     window=window)

  def turn_step(c, turn_and_key):
    turn, turn_key = turn_and_key
    offset = first_len + turn * (chunk_len + n_new)
    c = jax.lax.cond(turn > 0, next_chunk, lambda c, *_: c, c, turn, offset)  # turn 0's chunk is the prefill
    return play_turn(c, turn, offset, turn_key), None

  carry, _ = jax.lax.scan(turn_step, carry, (jnp.arange(n_turns), jax.random.split(key, n_turns)))
  return carry.writer.finish(carry.env_state.success, group_ids_B)
