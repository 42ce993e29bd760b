"""The trajectory batch: what rollouts produce and the learner and diagnostics consume.

One sequence per episode, packed to the left (real tokens first, then padding).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ragen_jax import mesh as mesh_lib

SUMMARY_FIELDS = ("success", "score", "num_turns", "response_start", "format_ok", "num_actions", "loss_mask",
                  "reasoning_len")  # what `rollout_metrics` reads


@flax.struct.dataclass
class Trajectories:
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
  reasoning_len: int32[B, K] tokens strictly between `<think>` and `</think>` at the
    start of the reply (0 when the reply has no closing `</think>`).
  turn_rewards: float32[B, K] env reward plus format penalty per turn.
  format_ok: bool[B, K] the turn had a parsable answer.
  score: float32[B] episode return (sum of turn_rewards).
  success: bool[B] the environment counts the episode solved.
  num_turns: int32[B]; num_actions: int32[B] actions executed.
  group_ids: int32[B] prompt group (episodes of a group share env seed).
  """

  tokens: jax.Array
  valid: jax.Array
  loss_mask: jax.Array
  sample_logp: jax.Array
  turn_of_token: jax.Array
  segment_ids: jax.Array
  visible_from: jax.Array
  turn_end: jax.Array
  token_rewards: jax.Array
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


def pack_left(valid_BS: jax.Array, *per_token_BS: jax.Array):
  """Moves each row's valid entries to the front (stable), for every per-token array.

  Returns (new_positions int32[B, S] of each old slot or -1, packed arrays...).
  """
  order = jnp.argsort(~valid_BS, axis=1, stable=True)
  packed = [jnp.take_along_axis(x, order, axis=1) for x in (valid_BS, *per_token_BS)]
  new_position = jnp.where(valid_BS, jnp.cumsum(valid_BS, axis=1) - 1, -1).astype(jnp.int32)
  return (new_position, *packed)


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
