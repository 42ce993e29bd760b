"""Solver demonstrations in the reference reply format, with input-dependent reasoning.

A scripted policy plays episodes through the host rollout path, so the
demonstrations have exactly the token layout the model later sees in RL. Each
reply names the positions that matter and the moves chosen from a BFS plan;
a share of turns deliberately takes one wrong move (RL then has room to improve).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from envs import solvers
from ragen_jax.rollout.episodes import unbatch


def _cells(mask) -> str:
  return ", ".join(f"({r}, {c})" for r, c in zip(*np.nonzero(np.asarray(mask)))) or "none"


def plan_and_reason(env_name: str, state) -> tuple[list[int], str]:
  """(BFS plan, reasoning text naming the relevant positions) for one env state."""
  row, col = (int(v) for v in np.asarray(state.player_pos))
  if env_name == "sokoban":
    fixed, room = np.asarray(state.room_fixed), np.asarray(state.room_state)
    plan = solvers.solve_sokoban(fixed, room, (row, col)) or []
    boxes, targets = (room == 4) | (room == 3), (fixed == 2)
    return plan, f"player ({row}, {col}), box {_cells(boxes)}, target {_cells(targets)}."
  if env_name == "frozenlake":
    desc = np.asarray(state.desc)
    plan = solvers.solve_frozenlake(desc, (row, col)) or []
    near = np.zeros_like(desc, bool)
    for dr, dc in solvers.FROZENLAKE_MOVES:
      if 0 <= row + dr < desc.shape[0] and 0 <= col + dc < desc.shape[1]:
        near[row + dr, col + dc] = True
    return plan, f"player ({row}, {col}), goal {_cells(desc == 3)}, holes near {_cells(near & (desc == 2))}."
  raise ValueError(f"no demonstrations for environment {env_name!r}")


@dataclasses.dataclass
class ScriptedReplies:
  """The fields of `sampling.Generation` that the host rollout reads."""

  tokens_BN: np.ndarray
  lengths_B: np.ndarray
  ended_by_eos_B: np.ndarray
  model_logp_BN: np.ndarray


def solver_policy(env_name: str, action_names, tokenizer, max_new_tokens: int, actions_per_turn: int,
                  mistake_rate: float, seed: int = 0):
  """A host-rollout policy that replies with the solver's next moves (sometimes one wrong move)."""
  rng = np.random.default_rng(seed)

  def policy(records, active, env_state, key):
    del records, key
    batch = len(active)
    tokens = np.zeros((batch, max_new_tokens), np.int32)
    lengths = np.zeros(batch, np.int32)
    for i in np.flatnonzero(active):
      plan, reasoning = plan_and_reason(env_name, unbatch(env_state, i))
      moves = list(plan[:actions_per_turn]) or [int(rng.integers(len(action_names)))]
      if rng.random() < mistake_rate:
        slot = int(rng.integers(len(moves)))
        moves[slot] = int(rng.choice([a for a in range(len(action_names)) if a != moves[slot]]))
      answer = " || ".join(action_names[a] for a in moves)
      ids = tokenizer.encode(f"{reasoning} So: {answer}.</think><answer>{answer}</answer>") + [
          tokenizer.eos_token_id]
      if len(ids) > max_new_tokens:
        raise ValueError(f"a demonstration reply has {len(ids)} tokens; raise rollout.max_new_tokens")
      tokens[i, :len(ids)], lengths[i] = ids, len(ids)
    return ScriptedReplies(tokens, lengths, active.copy(), np.zeros((batch, max_new_tokens), np.float32))

  return policy


def corpus(env, env_params, states, count: int) -> list[str]:
  """Text for training the demo tokenizer: observations, instructions, prompts, replies."""
  return [env.render_text(unbatch(states, i), env_params) for i in range(count)]
