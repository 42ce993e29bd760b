"""Two-armed bandit with semantic arm names (RAGEN's Bandit), on device.

Each episode draws a low-risk name and a high-risk name from a name pool
(`name_pool`: "train" or "test", disjoint) and shows them in random order;
action 0 pulls the first named arm, action 1 the second, and the action names
are the arm names themselves (`episode_action_names`, `action_name_table`).
The low-risk arm pays `low_risk_reward` (0.1); the high-risk arm pays
`high_risk_high_reward` (1.0) with probability `high_risk_high_prob` (0.25),
else `high_risk_low_reward` (0.0). One pull ends the episode; success means
the high-risk arm was pulled (RAGEN's definition). The name pools are ours.

Observation text: RAGEN's prompt before the pull (`PROMPT` with the names),
then "{arm}: {reward} points".
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
from flax import struct

from envs import core, text

PROMPT = (
  "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. \n"
  "Game Rules: \n"
  "1. There are 2 arms, named {a} and {b}\n"
  "2. Each arm has its own reward distribution, related to their names. \n"
  "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.\n"
  "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher "
  "rewards on average? Choose between {a} and {b}, and output like <answer> {a} </answer> or "
  "<answer> {b} </answer>.\n"
)
NAME_POOLS = {
  ("train", "low"): ("Turtle", "Librarian", "Accountant", "Oak", "Farmer", "Snail"),
  ("train", "high"): ("Dragon", "Gambler", "Stuntman", "Falcon", "Volcano", "Pirate"),
  ("test", "low"): ("Tortoise", "Teacher", "Gardener", "Mountain"),
  ("test", "high"): ("Daredevil", "Tiger", "Lottery", "Storm"),
}
NAMES = sum(NAME_POOLS.values(), ())  # global name ids index this tuple


def _pool_range(pool: str, risk: str) -> tuple[int, int]:
  """[start, stop) of a pool's names in NAMES."""
  start = NAMES.index(NAME_POOLS[(pool, risk)][0])
  return start, start + len(NAME_POOLS[(pool, risk)])


@struct.dataclass
class BanditParams:
  name_pool: str = struct.field(pytree_node=False, default="train")
  low_risk_reward: float = struct.field(pytree_node=False, default=0.1)
  high_risk_low_reward: float = struct.field(pytree_node=False, default=0.0)
  high_risk_high_reward: float = struct.field(pytree_node=False, default=1.0)
  high_risk_high_prob: float = 0.25


@struct.dataclass
class BanditState:
  arm_names: jax.Array  # int32[2] ids into NAMES, in display (= action) order
  high_risk_arm: jax.Array  # int32, 0 or 1
  chosen: jax.Array  # int32 arm pulled, -1 before
  payout: jax.Array  # int32 index into (low, high-risk low, high-risk high), -1 before
  done: jax.Array  # bool
  success: jax.Array  # bool


def _name_slot(prefix: str = "") -> tuple[str, ...]:
  return tuple(prefix + name for name in NAMES)


def _prompt_slots() -> tuple[text.Template, tuple[int, ...]]:
  """PROMPT as slots, each name slot carrying the space before the name.

  Returns (slots, arm shown by each slot: -1 for fixed text, else 0 or 1)."""
  slots, arms = [], []
  for i, piece in enumerate(re.split(r" \{([ab])\}", PROMPT)):
    if i % 2:
      slots.append(_name_slot(" "))
      arms.append("ab".index(piece))
    elif piece:
      slots.append((piece,))
      arms.append(-1)
  return tuple(slots), tuple(arms)


class Bandit(core.Environment):
  name = "bandit"
  instruction = ""  # RAGEN's Bandit puts everything in the observation

  def default_params(self) -> BanditParams:
    return BanditParams()

  def check_params(self, params: BanditParams) -> None:
    if params.name_pool not in ("train", "test"):
      raise ValueError(f"bandit: name_pool must be 'train' or 'test', got {params.name_pool!r}")
    if not 0.0 <= params.high_risk_high_prob <= 1.0:
      raise ValueError("bandit: high_risk_high_prob must lie in [0, 1]")

  def action_names(self, params) -> None:
    return None

  def num_actions(self, params) -> int:
    return 2

  def episode_action_names(self, state: BanditState, params) -> tuple[str, ...]:
    return tuple(NAMES[int(i)] for i in state.arm_names)

  def action_name_table(self, state: BanditState, params) -> tuple[jax.Array, jax.Array]:
    chars_NL, len_N = text.action_name_table(NAMES)
    return jnp.asarray(chars_NL)[state.arm_names], jnp.asarray(len_N)[state.arm_names]

  def reset_state(self, key, params: BanditParams) -> BanditState:
    k_low, k_high, k_order = jax.random.split(key, 3)
    low = jax.random.randint(k_low, (), *_pool_range(params.name_pool, "low"))
    high = jax.random.randint(k_high, (), *_pool_range(params.name_pool, "high"))
    high_first = jax.random.bernoulli(k_order)
    return BanditState(
      arm_names=jnp.where(high_first, jnp.stack([high, low]), jnp.stack([low, high])).astype(jnp.int32),
      high_risk_arm=jnp.where(high_first, 0, 1).astype(jnp.int32),
      chosen=jnp.int32(-1),
      payout=jnp.int32(-1),
      done=jnp.bool_(False),
      success=jnp.bool_(False),
    )

  def transition(self, key, state: BanditState, action, params: BanditParams):
    high = action == state.high_risk_arm
    jackpot = jax.random.uniform(key) < params.high_risk_high_prob
    payout = jnp.where(high, jnp.where(jackpot, 2, 1), 0).astype(jnp.int32)
    rewards = jnp.array(self._rewards(params), jnp.float32)
    next_state = state.replace(chosen=action, payout=payout, done=jnp.bool_(True), success=high)
    return next_state, rewards[payout], jnp.bool_(True)

  def observation(self, state: BanditState, params) -> jax.Array:
    """int32[2] name ids of the two arms in action order."""
    return state.arm_names

  @staticmethod
  def _rewards(params: BanditParams) -> tuple[float, float, float]:
    """Payout values in `BanditState.payout` order."""
    return params.low_risk_reward, params.high_risk_low_reward, params.high_risk_high_reward

  def template(self, params: BanditParams) -> text.Template:
    prompt, _ = _prompt_slots()
    return prompt + (_name_slot(), tuple(f": {r} points" for r in self._rewards(params)))

  def slot_choices(self, state: BanditState, params) -> jax.Array:
    _, arms = _prompt_slots()
    arm_S = jnp.array(arms)
    prompt = jnp.where(arm_S < 0, 0, state.arm_names[jnp.maximum(arm_S, 0)])
    result = jnp.stack([state.arm_names[jnp.maximum(state.chosen, 0)], state.payout])
    return jnp.where(
      state.done,
      jnp.concatenate([jnp.full_like(prompt, -1), result]),
      jnp.concatenate([prompt, jnp.full((2,), -1, jnp.int32)]),
    ).astype(jnp.int32)

  def render_text(self, state: BanditState, params: BanditParams) -> str:
    a, b = self.episode_action_names(state, params)
    if bool(state.done):
      return f"{(a, b)[int(state.chosen)]}: {self._rewards(params)[int(state.payout)]} points"
    return PROMPT.format(a=a, b=b)
