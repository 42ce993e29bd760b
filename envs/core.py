"""The environment interface shared by every on-device environment (gymnax style).

An environment object holds no state: `reset` and `step` are pure functions of
(key, state, action, params), so they jit and vmap, and equal results follow
from equal keys. Every state carries `done` and `success`; stepping a finished
episode returns it unchanged with zero reward, and so does an action id outside
the action set unless the env punishes it itself (`invalid_action_is_noop`).
Shapes that depend on params (grid sizes, box counts) come from params fields
marked static (`pytree_node=False`). `info` holds `success` and
`action_is_effective` (RAGEN's names).

What a rollout uses besides reset/step: `instruction_text` (system prompt
part), `token_table` (host, once per tokenizer), `render_tokens` and
`max_obs_tokens` (observation as token ids), `action_name_table` with
`keep_unknown_actions` (for `text.parse_actions`), and `render_text` (host).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from envs import text


def reachable(passable_HW: jax.Array, start_HW: jax.Array, max_distance: int | None = None) -> jax.Array:
  """bool[H, W]: passable cells joined to the `start_HW` cells by 4-neighbour moves.

  Exact for paths up to `max_distance` steps (default H * W - 1, always enough).
  """
  rows, cols = passable_HW.shape

  def grow(_, reach):
    padded = jnp.pad(reach, 1)
    neighbours = padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2] | padded[1:-1, 2:]
    return reach | (neighbours & passable_HW)

  steps = rows * cols - 1 if max_distance is None else max_distance
  return jax.lax.fori_loop(0, steps, grow, start_HW & passable_HW)


class Environment:
  """Base class; subclasses fill in the hooks at the bottom."""

  name: str
  instruction: str  # env instruction for the system prompt, as RAGEN words it
  symbol_legend: tuple[tuple[str, str], ...] = ()  # (symbol, meaning) pairs shown to the model
  keep_unknown_actions = False  # True: unknown names reach `step` as -1 (it punishes them)
  invalid_action_is_noop = True  # ids outside the action set leave the state unchanged

  # Stateless: every instance of a class is interchangeable (usable as a jit static argument).
  def __eq__(self, other):
    return type(self) is type(other)

  def __hash__(self):
    return hash(type(self))

  def make_params(self, **overrides):
    """Default params with `overrides`; ValueError on unknown names or bad values."""
    params = self.default_params()
    names = {f.name for f in dataclasses.fields(params)}
    unknown = sorted(set(overrides) - names)
    if unknown:
      raise ValueError(f"{self.name}: unknown parameter(s) {unknown}; known: {sorted(names)}")
    params = params.replace(**overrides)
    self.check_params(params)
    return params

  def reset(self, key: jax.Array, params):
    """(obs, state) of a new episode."""
    state = self.reset_state(key, params)
    return self.observation(state, params), state

  def step(self, key: jax.Array, state, action: jax.Array, params):
    """(obs, state, reward float32, done bool, info) after `action`."""
    action = jnp.asarray(action, jnp.int32)
    new_state, reward, effective = self.transition(key, state, action, params)
    keep = state.done
    if self.invalid_action_is_noop:
      keep = keep | (action < 0) | (action >= self.num_actions(params))
    new_state = jax.tree.map(lambda old, new: jnp.where(keep, old, new), state, new_state)
    reward = jnp.where(keep, 0.0, reward).astype(jnp.float32)
    info = {"success": new_state.success, "action_is_effective": effective & ~keep}
    return self.observation(new_state, params), new_state, reward, new_state.done, info

  def num_actions(self, params) -> int:
    return len(self.action_names(params))

  def episode_action_names(self, state, params) -> tuple[str, ...]:
    """Host: this episode's action names, index = action id."""
    return self.action_names(params)

  def action_name_table(self, state, params) -> tuple[jax.Array, jax.Array]:
    """Jittable: (uint8[A, L], int32[A]) action names for `text.parse_actions`."""
    return tuple(map(jnp.asarray, text.action_name_table(self.action_names(params))))

  def instruction_text(self, params, max_actions_per_traj: int) -> str:
    """Env part of the system prompt, laid out like RAGEN's context manager."""
    out = self.instruction
    if self.symbol_legend:
      legend = ", ".join(f"{symbol}: {meaning}" for symbol, meaning in self.symbol_legend)
      out += f"\nThe meaning of each symbol in the state is:\n{legend}"
    if self.action_names(params):
      out += "\nYour available actions are:\n" + ", ".join(self.action_names(params))
      out += f"\nYou can make up to {max_actions_per_traj} actions, "
      out += f'separated by the action separator " {text.ACTION_SEP} "\n'
    return out

  def token_table(self, vocab: text.Vocab, params) -> text.TextTable:
    """Host: tokenise this env's observation template for `vocab`."""
    return text.compile_template(vocab, self.template(params))

  @staticmethod
  def max_obs_tokens(table: text.TextTable) -> int:
    return table.max_tokens

  def render_tokens(self, state, params, table: text.TextTable) -> tuple[jax.Array, jax.Array]:
    """Jittable: observation as (token ids int32[max_obs_tokens], length int32)."""
    return text.render_slots(table, self.slot_choices(state, params))

  # ---- hooks -------------------------------------------------------------
  def default_params(self):
    raise NotImplementedError

  def check_params(self, params) -> None:
    raise NotImplementedError

  def action_names(self, params) -> tuple[str, ...] | None:
    """Action names, index = action id; None when they change per episode."""
    raise NotImplementedError

  def reset_state(self, key, params):
    raise NotImplementedError

  def transition(self, key, state, action, params):
    """(next state, reward, action_is_effective) ignoring `done` (the base handles it)."""
    raise NotImplementedError

  def observation(self, state, params) -> jax.Array:
    raise NotImplementedError

  def template(self, params) -> text.Template:
    raise NotImplementedError

  def slot_choices(self, state, params) -> jax.Array:
    raise NotImplementedError

  def render_text(self, state, params) -> str:
    """Host: the observation text (independent of the token template)."""
    raise NotImplementedError
