"""Lights Out (RAGEN's LightsOut) on device.

An n x n grid of lights (1 on, 0 off). Action id r * n + c ("toggle r c")
flips cell (r, c) and its orthogonal neighbours. Reset scrambles an empty
board with `scramble_depth` uniform random toggles, retrying up to
`num_scramble_attempts` times for a board with a light on (then toggling the
centre, as RAGEN does). Reward: (lights before - lights after) / n^2, +1 when
all are off; any other action id (the parser passes unknown answers on as -1,
since `keep_unknown_actions` is set) costs -0.2 and a step. The episode ends
when solved or after `max_steps` steps.

RAGEN parses the action text leniently (the first two integers); here an
action must read "toggle r c" (ASCII case and surrounding whitespace ignored),
and every other answer is an invalid action.

Observation text (RAGEN's render), e.g. after one toggle:

    === Lights Out ===
    Step: 1/8
    Lights on: 3/9

    Grid uses 1 for on and 0 for off. Coordinates are zero-indexed.
         c0  c1  c2
    r0:  1  0  1
    r1:  0  0  0
    r2:  0  1  0

    Action format: <answer>toggle row col</answer>, for example <answer>toggle 0 1</answer>.

    Toggled (1, 1).            <- or "Invalid action: ..."; " Puzzle solved." /
                                  " Max steps reached." may follow
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import core, text

NOTHING_YET, INVALID = -2, -1  # LightsOutState.last_action besides a cell id
INVALID_MESSAGE = "Invalid action: expected two zero-indexed coordinates"
ACTION_FORMAT = "Action format: <answer>toggle row col</answer>, for example <answer>toggle 0 1</answer>."


@struct.dataclass
class LightsOutParams:
  size: int = struct.field(pytree_node=False, default=3)
  scramble_depth: int = struct.field(pytree_node=False, default=4)
  num_scramble_attempts: int = struct.field(pytree_node=False, default=20)
  max_steps: int = struct.field(pytree_node=False, default=8)
  shaped_reward: bool = struct.field(pytree_node=False, default=True)
  success_reward: float = 1.0
  invalid_action_reward: float = -0.2


@struct.dataclass
class LightsOutState:
  grid: jax.Array  # int8[n, n], 1 = on
  steps: jax.Array  # int32
  last_action: jax.Array  # int32 cell toggled last, INVALID or NOTHING_YET
  done: jax.Array  # bool
  success: jax.Array  # bool


def toggle_patterns(size: int) -> np.ndarray:
  """bool[n*n, n*n]: the cells each toggle flips."""
  row, col = np.divmod(np.arange(size * size), size)
  return (np.abs(row[:, None] - row) + np.abs(col[:, None] - col)) <= 1


class LightsOut(core.Environment):
  name = "lightsout"
  instruction = (
    "You are solving the Lights Out puzzle. Toggling a cell flips it and its up, down, left and right "
    "neighbours. Turn all the lights off. The answer should be a sequence of toggles, like "
    "<answer>toggle 0 1 || toggle 2 2</answer>"
  )
  keep_unknown_actions = True
  invalid_action_is_noop = False

  def default_params(self) -> LightsOutParams:
    return LightsOutParams()

  def check_params(self, params: LightsOutParams) -> None:
    if params.size < 2:
      raise ValueError(f"lightsout: size must be >= 2, got {params.size}")
    if params.scramble_depth < 0 or params.num_scramble_attempts < 1 or params.max_steps < 1:
      raise ValueError("lightsout: scramble_depth >= 0, num_scramble_attempts >= 1 and max_steps >= 1 required")

  def action_names(self, params: LightsOutParams) -> tuple[str, ...]:
    return tuple(f"toggle {r} {c}" for r in range(params.size) for c in range(params.size))

  def instruction_text(self, params, max_actions_per_traj: int) -> str:
    return self.instruction  # RAGEN lists no action names for this language-action env

  def reset_state(self, key, params: LightsOutParams) -> LightsOutState:
    n, patterns = params.size, jnp.asarray(toggle_patterns(params.size))
    cells_AD = jax.random.randint(key, (params.num_scramble_attempts, params.scramble_depth), 0, n * n)
    grids_AF = (jnp.sum(patterns[cells_AD], axis=1) % 2).astype(jnp.int8)
    lit_A = jnp.sum(grids_AF, axis=1) > 0
    centre = patterns[(n // 2) * n + n // 2].astype(jnp.int8)
    grid = jnp.where(jnp.any(lit_A), grids_AF[jnp.argmax(lit_A)], centre if params.scramble_depth else 0)
    return LightsOutState(
      grid=grid.reshape(n, n).astype(jnp.int8),
      steps=jnp.int32(0),
      last_action=jnp.int32(NOTHING_YET),
      done=jnp.bool_(False),
      success=jnp.bool_(False),
    )

  def transition(self, key, state: LightsOutState, action, params: LightsOutParams):
    n = params.size
    valid = (action >= 0) & (action < n * n)
    flip = jnp.asarray(toggle_patterns(n))[jnp.clip(action, 0, n * n - 1)].reshape(n, n) & valid
    grid = state.grid ^ flip.astype(jnp.int8)
    lit_before, lit_after = jnp.sum(state.grid), jnp.sum(grid)
    solved = valid & (lit_after == 0)
    shaped = (lit_before - lit_after) / (n * n) if params.shaped_reward else 0.0
    reward = jnp.where(valid, shaped + jnp.where(solved, params.success_reward, 0.0), params.invalid_action_reward)
    steps = state.steps + 1
    next_state = state.replace(
      grid=grid,
      steps=steps,
      last_action=jnp.where(valid, action, INVALID).astype(jnp.int32),
      done=solved | (steps >= params.max_steps),
      success=solved,
    )
    return next_state, reward, valid

  def observation(self, state: LightsOutState, params) -> jax.Array:
    """int8[n, n] lights."""
    return state.grid

  def template(self, params: LightsOutParams) -> text.Template:
    n, steps = params.size, params.max_steps
    head = "     " + "  ".join(f"c{c}" for c in range(n))
    slots = [
      ("=== Lights Out ===\nStep: ",),
      tuple(str(k) for k in range(steps + 1)),
      (f"/{steps}\nLights on: ",),
      tuple(str(k) for k in range(n * n + 1)),
      (f"/{n * n}\n\nGrid uses 1 for on and 0 for off. Coordinates are zero-indexed.\n{head}",),
    ]
    for r in range(n):
      slots += [(f"\nr{r}:  ",), ("0", "1")] + [("  0", "  1")] * (n - 1)
    slots += [
      ("\n\n" + ACTION_FORMAT,),
      tuple(f"\n\nToggled ({r}, {c})." for r in range(n) for c in range(n)) + ("\n\n" + INVALID_MESSAGE,),
      (" Puzzle solved.", " Max steps reached."),
    ]
    return tuple(slots)

  def slot_choices(self, state: LightsOutState, params: LightsOutParams) -> jax.Array:
    n = params.size
    grid_HW = state.grid.astype(jnp.int32)
    rows = jnp.concatenate([jnp.zeros((n, 1), jnp.int32), grid_HW], axis=1).ravel()  # row label, cells
    toggled = state.last_action >= 0
    message = jnp.where(toggled, state.last_action, jnp.where(state.last_action == INVALID, n * n, -1))
    ending = jnp.where(toggled & state.success, 0, jnp.where(toggled & state.done, 1, -1))
    head = jnp.stack([0, state.steps, 0, jnp.sum(grid_HW), 0])
    return jnp.concatenate([head, rows, jnp.stack([0, message, ending])]).astype(jnp.int32)

  def render_text(self, state: LightsOutState, params: LightsOutParams) -> str:
    grid, n = np.asarray(state.grid), params.size
    lines = [
      "=== Lights Out ===",
      f"Step: {int(state.steps)}/{params.max_steps}",
      f"Lights on: {int(grid.sum())}/{n * n}",
      "",
      "Grid uses 1 for on and 0 for off. Coordinates are zero-indexed.",
      "     " + "  ".join(f"c{c}" for c in range(n)),
    ]
    lines += [f"r{r}:  " + "  ".join(str(int(v)) for v in grid[r]) for r in range(n)]
    lines += ["", ACTION_FORMAT]
    last = int(state.last_action)
    if last == INVALID:
      lines += ["", INVALID_MESSAGE]
    elif last >= 0:
      message = f"Toggled ({last // n}, {last % n})."
      if bool(state.success):
        message += " Puzzle solved."
      elif bool(state.done):
        message += " Max steps reached."
      lines += ["", message]
    return "\n".join(lines)
