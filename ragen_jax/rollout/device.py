"""The device rollout path: whole multi-turn episodes inside one jit.

Turns run in `lax.scan`; each turn renders the observation to tokens, appends it
to the KV cache (no re-prefill of the history), samples the reply, parses the
answer and steps the environments, all vmapped over the batch of episodes.
Every token lives in a fixed slot of the cache, so shapes are static; slots a
row does not use are holes that attention skips, and the result is packed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.partitioning import constrain
from ragen_jax.rollout import prompt
from ragen_jax.rollout.episodes import (RolloutAssets, RolloutConfig, act, reasoning_length, render_batch,
                                        reset_batch, visible_from)
from ragen_jax.sampling import decode, extend, prefill
from ragen_jax.trajectories import Trajectories, pack_left


def slot_layout(assets: RolloutAssets, config: RolloutConfig) -> tuple[int, int, int]:
  """(first chunk length C0, later chunk length C, total slots S) of a rollout."""
  obs, turns = assets.observation.max_tokens, assets.turns
  first = turns.system.max_tokens + turns.first.max_tokens + obs + turns.tail.max_tokens
  later = turns.head.max_tokens + obs + turns.tail.max_tokens
  return first, later, first + config.max_new_tokens + (config.max_turns - 1) * (later + config.max_new_tokens)


def _write(buffer_BS, values_BT, offset):
  return jax.lax.dynamic_update_slice(buffer_BS, values_BT.astype(buffer_BS.dtype), (0, offset))


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
  slots = lambda dtype, fill=0: constrain(jnp.full((batch, n_slots), fill, dtype), ("batch", None))  # noqa: E731
  per_turn = lambda dtype, fill=0: jnp.full((batch, n_turns), fill, dtype)  # noqa: E731
  system_tokens = assets.turns.system.max_tokens
  windows = jax.vmap(functools.partial(visible_from, config), in_axes=(None, 0, 0, None))
  window = windows(0, per_turn(jnp.int32), jnp.sum(chunk_valid, axis=1) - system_tokens, system_tokens)
  segment = jnp.broadcast_to(prompt.chunk_segments(assets.turns, first_len, 0), chunk.shape)
  window_BT = jnp.broadcast_to(window[:, None], chunk.shape)
  carry = dict(
      sampler=prefill(model_config, params, chunk, chunk_valid, n_slots, segment, window_BT), env_state=env_state_B,
      done=jnp.zeros((batch,), bool), actions_left=actions_left, reward=jnp.zeros((batch,), jnp.float32),
      ended_by_eos=jnp.zeros((batch,), bool), num_turns=jnp.zeros((batch,), jnp.int32),
      num_actions=jnp.zeros((batch,), jnp.int32),
      tokens=_write(slots(jnp.int32), chunk, 0), valid=_write(slots(bool, False), chunk_valid, 0),
      generated=slots(bool, False), logp=slots(jnp.float32), turn_of_token=_write(slots(jnp.int32, -1),
                                                                                   jnp.where(chunk_valid, 0, -1), 0),
      turn_end=slots(bool, False), token_rewards=slots(jnp.float32),
      segment=_write(slots(jnp.int32), segment, 0), visible_from=_write(slots(jnp.int32), window_BT, 0),
      window=window, turn_tokens=per_turn(jnp.int32).at[:, 0].set(jnp.sum(chunk_valid, axis=1) - system_tokens),
      response_start=per_turn(jnp.int32, -1), response_len=per_turn(jnp.int32), reasoning_len=per_turn(jnp.int32),
      turn_rewards=per_turn(jnp.float32), format_ok=per_turn(bool, False))

  def play_turn(c, turn, offset, turn_key):
    active = ~c["done"]
    sample_key, env_key = jax.random.split(turn_key)
    sampler, gen = decode(model_config, params, c["sampler"], sample_key, rule=config.rule, max_new_tokens=n_new,
                          stop_sequences_ML=assets.stop_sequences, active_B=active,
                          segment_B=jnp.full((batch,), turn + 1, jnp.int32), visible_from_B=c["window"])
    written = jnp.arange(n_new)[None] < gen.lengths_B[:, None]
    outcome = act(env, env_params, assets, config, env_key, c["env_state"], gen.tokens_BN, gen.lengths_B, active,
                  c["actions_left"])
    last = written & (jnp.arange(n_new)[None] == gen.lengths_B[:, None] - 1)
    think = jax.vmap(reasoning_length, in_axes=(None, 0, 0))(assets.vocab, gen.tokens_BN, gen.lengths_B)
    at_turn = lambda per_turn_BK, value: per_turn_BK.at[:, turn].set(value)  # noqa: E731
    return {**c, "sampler": sampler, "env_state": outcome.env_state, "done": outcome.done,
            "actions_left": outcome.actions_left, "reward": outcome.reward, "ended_by_eos": gen.ended_by_eos_B,
            "num_turns": c["num_turns"] + active, "num_actions": c["num_actions"] + outcome.num_actions,
            "tokens": _write(c["tokens"], jnp.where(written, gen.tokens_BN, 0), offset),
            "valid": _write(c["valid"], written, offset), "generated": _write(c["generated"], written, offset),
            "logp": _write(c["logp"], jnp.where(written, gen.model_logp_BN, 0.0), offset),
            "turn_of_token": _write(c["turn_of_token"], jnp.where(written, turn, -1), offset),
            "turn_end": _write(c["turn_end"], last, offset),
            "segment": _write(c["segment"], jnp.where(written, turn + 1, 0), offset),
            "visible_from": _write(c["visible_from"], jnp.where(written, c["window"][:, None], 0), offset),
            "turn_tokens": c["turn_tokens"].at[:, turn].add(gen.lengths_B),
            "token_rewards": _write(c["token_rewards"], jnp.where(last, outcome.reward[:, None], 0.0), offset),
            "response_start": at_turn(c["response_start"], jnp.where(active, offset, -1)),
            "response_len": at_turn(c["response_len"], gen.lengths_B),
            "reasoning_len": at_turn(c["reasoning_len"], think),
            "turn_rewards": at_turn(c["turn_rewards"], jnp.where(active, outcome.reward, 0.0)),
            "format_ok": at_turn(c["format_ok"], outcome.format_ok)}

  def next_chunk(c, turn, offset):
    """Appends turn `turn`'s prompt chunk (observation, reward, reminders) before its reply at `offset`."""
    active = ~c["done"]
    obs_ids, obs_len = render(c["env_state"])
    chunk, chunk_valid = jax.vmap(prompt.turn_chunk, in_axes=(None, 0, 0, None, 0, 0, 0))(
        assets.turns, obs_ids, obs_len, turn, c["reward"], c["ended_by_eos"], c["actions_left"])
    chunk_valid &= active[:, None]
    chunk_tokens = jnp.sum(chunk_valid, axis=1)
    window = windows(turn, c["turn_tokens"], chunk_tokens, system_tokens)
    segment = jnp.where(chunk_valid, turn + 1, 0)
    window_BT = jnp.where(chunk_valid, window[:, None], 0)
    return {**c, "sampler": extend(model_config, params, c["sampler"], chunk, chunk_valid, segment, window_BT),
            "tokens": _write(c["tokens"], jnp.where(chunk_valid, chunk, 0), offset - chunk_len),
            "valid": _write(c["valid"], chunk_valid, offset - chunk_len),
            "segment": _write(c["segment"], segment, offset - chunk_len),
            "visible_from": _write(c["visible_from"], window_BT, offset - chunk_len),
            "window": window, "turn_tokens": c["turn_tokens"].at[:, turn].set(chunk_tokens),
            "turn_of_token": _write(c["turn_of_token"], jnp.where(chunk_valid, turn, -1), offset - chunk_len)}

  def turn_step(c, turn_and_key):
    turn, turn_key = turn_and_key
    offset = first_len + turn * (chunk_len + n_new)
    c = jax.lax.cond(turn > 0, next_chunk, lambda c, *_: c, c, turn, offset)  # turn 0's chunk is the prefill
    return play_turn(c, turn, offset, turn_key), None

  carry, _ = jax.lax.scan(turn_step, carry, (jnp.arange(n_turns), jax.random.split(key, n_turns)))
  return _finish(carry, carry["env_state"].success, group_ids_B)


def _finish(c, success_B, group_ids_B) -> Trajectories:
  """Packs the slot buffers to the left and derives the episode-level fields."""
  new_position, valid, tokens, generated, logp, turn_of_token, turn_end, token_rewards, segment, window = pack_left(
      c["valid"], c["tokens"], c["generated"], c["logp"], c["turn_of_token"], c["turn_end"], c["token_rewards"],
      c["segment"], c["visible_from"])
  response_start = jnp.where(c["response_start"] >= 0,
                             jnp.take_along_axis(new_position, jnp.maximum(c["response_start"], 0), axis=1), -1)
  score = jnp.sum(c["turn_rewards"], axis=1)
  last_generated = jnp.max(jnp.where(generated, jnp.arange(tokens.shape[1]), -1), axis=1)
  score_rewards = jnp.where(jnp.arange(tokens.shape[1])[None] == last_generated[:, None], score[:, None], 0.0)
  return Trajectories(
      tokens=tokens, valid=valid, loss_mask=generated, sample_logp=logp, turn_of_token=turn_of_token,
      segment_ids=jnp.where(valid, segment, 0), visible_from=jnp.where(valid, window, 0),
      turn_end=turn_end, token_rewards=token_rewards, score_rewards=score_rewards.astype(jnp.float32),
      response_start=response_start, response_len=c["response_len"], reasoning_len=c["reasoning_len"],
      turn_rewards=c["turn_rewards"], format_ok=c["format_ok"], score=score, success=success_B,
      num_turns=c["num_turns"], num_actions=c["num_actions"], group_ids=group_ids_B.astype(jnp.int32))
