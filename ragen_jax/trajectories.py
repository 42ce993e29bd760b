"""The trajectory batch: what rollouts produce and the learner and diagnostics consume.

One sequence per episode, packed to the left (real tokens first, then padding).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import mesh as mesh_lib

SUMMARY_FIELDS = ("success", "score", "num_turns", "response_start", "format_ok", "num_actions", "loss_mask",
                  "reasoning_len")  # what `rollout_metrics` reads


@flax.struct.dataclass
class TokenSlots:
  """The per-token fields of `Trajectories` (see there), for all slots [B, S] or for a block of them [B, T]."""

  tokens: jax.Array
  valid: jax.Array
  loss_mask: jax.Array
  sample_logp: jax.Array
  turn_of_token: jax.Array
  segment_ids: jax.Array
  visible_from: jax.Array
  turn_end: jax.Array
  token_rewards: jax.Array


@flax.struct.dataclass
class Trajectories(TokenSlots):
  """A batch of B episodes of at most K turns, sequences of length T.

  tokens: int32[B, T] the whole conversation (system prompt, user turns, replies).
  valid: bool[B, T] real tokens (the rest is padding after them).
  loss_mask: bool[B, T] tokens the policy generated (never prompt/observation tokens).
  sample_logp: float32[B, T] log-prob of each generated token under the unmodified
    model at sampling time (0 elsewhere).
  turn_of_token: int32[B, T] turn index of each token (-1 for padding).
  segment_ids / visible_from: int32[B, T] the context window each token was sampled
    with (see `models.transformer`: segment 0 is the system prompt, k + 1 turn k; a token
    sees segment 0 and segments >= its visible_from); the learner scores with the same.
  turn_end: bool[B, T] the last generated token of each turn.
  token_rewards: float32[B, T] each turn's reward on its last generated token.
  score_rewards: float32[B, T] the episode score on the last generated token.
  response_start: int32[B, K] position of each turn's first generated token (-1: no turn).
  response_len: int32[B, K] generated tokens per turn.
  reasoning_len: int32[B, K] reasoning tokens of the reply under the answer grammar (`envs.text`):
    before the `</think>` right ahead of the answer block (0 without a well-formed answer).
  turn_rewards: float32[B, K] env reward plus format penalty per turn.
  format_ok: bool[B, K] the turn had a well-formed answer of recognised actions (no format penalty).
  score: float32[B] episode return (sum of turn_rewards).
  success: bool[B] the environment counts the episode solved.
  num_turns: int32[B]; num_actions: int32[B] actions executed.
  group_ids: int32[B] prompt group (episodes of a group share env seed).
  """

  score_rewards: jax.Array
  response_start: jax.Array
  response_len: jax.Array
  reasoning_len: jax.Array
  turn_rewards: jax.Array
  format_ok: jax.Array
  score: jax.Array
  success: jax.Array
  num_turns: jax.Array
  num_actions: jax.Array
  group_ids: jax.Array

  @property
  def batch_size(self) -> int:
    return self.tokens.shape[0]

  @property
  def seq_len(self) -> int:
    return self.tokens.shape[1]


def pack_left(valid_BS: jax.Array, per_token):
  """Moves each row's valid entries to the front (stable) in every [B, S] array of the pytree `per_token`.

  Returns (new_position int32[B, S] of each old slot or -1, the packed pytree).
  """
  order = jnp.argsort(~valid_BS, axis=1, stable=True)
  packed = jax.tree.map(lambda x: jnp.take_along_axis(x, order, axis=1), per_token)
  new_position = jnp.where(valid_BS, jnp.cumsum(valid_BS, axis=1) - 1, -1).astype(jnp.int32)
  return new_position, packed


def _empty_slots(batch: int, num_slots: int) -> TokenSlots:
  slots = lambda dtype, fill=0: jnp.full((batch, num_slots), fill, dtype)  # noqa: E731
  return TokenSlots(tokens=slots(jnp.int32), valid=slots(bool, False), loss_mask=slots(bool, False),
                    sample_logp=slots(jnp.float32), turn_of_token=slots(jnp.int32, -1), segment_ids=slots(jnp.int32),
                    visible_from=slots(jnp.int32), turn_end=slots(bool, False), token_rewards=slots(jnp.float32))


def _block(valid_BT, tokens_BT, turn, segment_BT, visible_from_B, generated: bool = False, logp_BT=0.0,
           turn_end_BT=False, token_rewards_BT=0.0) -> TokenSlots:
  """A block of turn `turn`'s tokens; slots where `valid_BT` is False hold the values of `_empty_slots`."""
  keep = lambda x, fill=0: jnp.where(valid_BT, x, fill)  # noqa: E731
  return TokenSlots(tokens=keep(tokens_BT), valid=valid_BT, loss_mask=keep(generated, False),
                    sample_logp=keep(logp_BT), turn_of_token=keep(turn, -1), segment_ids=keep(segment_BT),
                    visible_from=keep(visible_from_B[:, None]), turn_end=keep(turn_end_BT, False),
                    token_rewards=keep(token_rewards_BT))


@flax.struct.dataclass
class TrajectoryWriter:
  """Trajectories under construction, written turn by turn by every rollout path (a pytree; methods are jitted).

  slots: per-token buffers [B, S]. Chunks and replies are written at an `offset`: a scalar writes
    every row's block as it is at the same slots (the device path's fixed layout, holes included);
    int32[B] writes each row's valid entries one after another from its own offset (the host
    paths: each episode's length so far; entries past S are dropped, so check room first).
  response_start: int32[B, K] slot of each turn's first generated token (-1: no reply);
  response_len, reasoning_len, turn_rewards, format_ok: [B, K] per turn, as in `Trajectories`
    (reasoning_len from `rollout.episodes.reasoning_lengths`).
  num_turns / num_actions: int32[B].
  """

  slots: TokenSlots
  response_start: jax.Array
  response_len: jax.Array
  reasoning_len: jax.Array
  turn_rewards: jax.Array
  format_ok: jax.Array
  num_turns: jax.Array
  num_actions: jax.Array

  @classmethod
  def empty(cls, batch: int, num_slots: int, max_turns: int) -> TrajectoryWriter:
    """A writer of `batch` episodes of at most `max_turns` turns in `num_slots` token slots."""
    per_turn = lambda dtype, fill=0: jnp.full((batch, max_turns), fill, dtype)  # noqa: E731
    return cls(slots=_empty_slots(batch, num_slots), response_start=per_turn(jnp.int32, -1),
               response_len=per_turn(jnp.int32), reasoning_len=per_turn(jnp.int32), turn_rewards=per_turn(jnp.float32),
               format_ok=per_turn(bool, False), num_turns=jnp.zeros((batch,), jnp.int32),
               num_actions=jnp.zeros((batch,), jnp.int32))

  def _write(self, block: TokenSlots, offset) -> TokenSlots:
    if jnp.ndim(offset) == 0:
      put = lambda buffer, x: jax.lax.dynamic_update_slice(buffer, x.astype(buffer.dtype), (0, offset))  # noqa: E731
    else:
      batch, num_slots = block.valid.shape[0], self.slots.valid.shape[1]
      column_BT = jnp.where(block.valid, offset[:, None] + jnp.cumsum(block.valid, axis=1) - 1, num_slots)
      put = lambda buffer, x: buffer.at[jnp.arange(batch)[:, None], column_BT].set(  # noqa: E731
          x.astype(buffer.dtype), mode="drop")
    return jax.tree.map(put, self.slots, block)

  @jax.jit
  def write_chunk(self, offset, turn, tokens_BT, valid_BT, segment_BT, visible_from_B) -> TrajectoryWriter:
    """Writes turn `turn`'s prompt chunk (segment_BT: 0 for the system prompt, turn + 1 for the rest;
    visible_from_B: the turn's context window, see `Trajectories`)."""
    return self.replace(slots=self._write(_block(valid_BT, tokens_BT, turn, segment_BT, visible_from_B), offset))

  @jax.jit
  def write_reply(self, offset, turn, active_B, tokens_BN, lengths_B, logp_BN, visible_from_B, reward_B, format_ok_B,
                  reasoning_len_B, num_actions_B) -> TrajectoryWriter:
    """Writes turn `turn`'s replies (the first lengths_B of tokens_BN, their sampling log-probs logp_BN) and
    its outcome (reward with format penalty, parsable answer, reasoning length, actions executed) for the
    `active_B` rows; the others are left as they are."""
    lengths_B = jnp.where(active_B, lengths_B, 0)
    position_N = jnp.arange(tokens_BN.shape[1])
    written = position_N[None] < lengths_B[:, None]
    last = written & (position_N[None] == lengths_B[:, None] - 1)
    block = _block(written, tokens_BN, turn, turn + 1, visible_from_B, generated=True, logp_BT=logp_BN,
                   turn_end_BT=last, token_rewards_BT=jnp.where(last, reward_B[:, None], 0.0))
    at_turn = lambda per_turn_BK, value_B: per_turn_BK.at[:, turn].set(  # noqa: E731
        jnp.where(active_B, value_B, jnp.zeros((), per_turn_BK.dtype)))
    return self.replace(
        slots=self._write(block, offset),
        response_start=self.response_start.at[:, turn].set(jnp.where(lengths_B > 0, offset, -1)),
        response_len=at_turn(self.response_len, lengths_B), reasoning_len=at_turn(self.reasoning_len, reasoning_len_B),
        turn_rewards=at_turn(self.turn_rewards, reward_B), format_ok=at_turn(self.format_ok, format_ok_B),
        num_turns=self.num_turns + active_B, num_actions=self.num_actions + jnp.where(active_B, num_actions_B, 0))

  def turn_tokens(self) -> jax.Array:
    """int32[B, K]: tokens of each turn so far (prompt chunk and reply; the system prompt not counted)."""
    max_turns = self.response_len.shape[1]
    return jax.vmap(lambda segment_S: jnp.bincount(segment_S, length=max_turns + 1))(
        self.slots.segment_ids)[:, 1:].astype(jnp.int32)

  @jax.jit
  def finish(self, success_B, group_ids_B) -> Trajectories:
    """Packs the slots to the left and derives the episode-level fields."""
    new_position, slots = pack_left(self.slots.valid, self.slots)
    position_S = jnp.arange(slots.tokens.shape[1])
    response_start = jnp.where(self.response_start >= 0,
                               jnp.take_along_axis(new_position, jnp.maximum(self.response_start, 0), axis=1), -1)
    score = jnp.sum(self.turn_rewards, axis=1)
    last_generated = jnp.max(jnp.where(slots.loss_mask, position_S, -1), axis=1)
    score_rewards = jnp.where(position_S[None] == last_generated[:, None], score[:, None], 0.0)
    return Trajectories(
        **{field.name: getattr(slots, field.name) for field in dataclasses.fields(TokenSlots)},
        score_rewards=score_rewards.astype(jnp.float32), response_start=response_start,
        response_len=self.response_len, reasoning_len=self.reasoning_len, turn_rewards=self.turn_rewards,
        format_ok=self.format_ok, score=score, success=jnp.asarray(success_B, bool), num_turns=self.num_turns,
        num_actions=self.num_actions, group_ids=jnp.asarray(group_ids_B, jnp.int32))


def rollout_metrics(traj: Trajectories, prefix: str) -> dict[str, float]:
  """Host summary of a trajectory batch (gathered from every process: call it from all of them)."""
  t = mesh_lib.fetch({name: getattr(traj, name) for name in SUMMARY_FIELDS})
  turns = np.maximum(t["num_turns"], 1)
  played = max(np.sum(t["response_start"] >= 0), 1)
  return {f"{prefix}/success": float(np.mean(t["success"])), f"{prefix}/score": float(np.mean(t["score"])),
          f"{prefix}/num_turns": float(np.mean(t["num_turns"])),
          f"{prefix}/valid_action_rate": float(np.sum(t["format_ok"]) / played),
          f"{prefix}/actions_per_turn": float(np.mean(t["num_actions"] / turns)),
          f"{prefix}/response_length": float(np.sum(t["loss_mask"]) / played),
          f"{prefix}/valid_thinking_rate": float(np.sum(t["reasoning_len"] > 0) / played)}
