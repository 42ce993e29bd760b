"""FrozenLake (RAGEN's CoordFrozenLake) on device, with gymnasium's dynamics.

`desc` is the map as an int grid: 0 start, 1 frozen, 2 hole, 3 goal. Actions
0..3 are Left, Down, Right, Up (gymnasium's order). With probability
`success_rate` the move goes where asked, otherwise to one of the two
perpendicular directions with equal odds (gymnasium's slippery rule with its
`success_rate`); moves off the map stay put. Reward 1 on reaching the goal,
else 0; the episode ends in the goal, in a hole, or after `max_steps` steps.

Maps are RAGEN's random maps: each cell frozen with probability `p_frozen`,
start and goal on two distinct uniform cells, kept when a path joins them.
`num_map_attempts` maps are drawn at once and the first with a path is used;
if none has one, the first gets the holes on an L-shaped start-goal path
cleared, so every map has a path.

Observation text (RAGEN `grid_coord` format; the holes line is left out when
there are none):

    Coordinates: \\n
    Board size: 4 rows x 4 cols (zero-indexed).
    Start: (2, 3)
    Goal: (3, 0)
    Player: (2, 3)          <- or "Player on goal: ..." / "Player in hole: ..."
    Holes: (0, 3), (1, 1)
    Grid Map: \\n
    ___O
    _O__
    ___P
    G___

Grid symbols (RAGEN's): `P` player, `_` frozen (the start too), `O` hole,
`G` goal, `X` player in a hole, `√` player on the goal; the numeric
observation uses codes 0..5 in that order.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import core, text

START, FROZEN, HOLE, GOAL = range(4)
SYMBOLS = ("P", "_", "O", "G", "X", "√")
PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL = 0, 4, 5
MOVES = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]], np.int32)  # Left, Down, Right, Up


@struct.dataclass
class FrozenLakeParams:
  size: int = struct.field(pytree_node=False, default=4)
  num_map_attempts: int = struct.field(pytree_node=False, default=16)
  p_frozen: float = 0.9
  success_rate: float = 1.0
  max_steps: int = 100


@struct.dataclass
class FrozenLakeState:
  desc: jax.Array  # int8[n, n]
  player_pos: jax.Array  # int32[2] (row, col)
  steps: jax.Array  # int32
  done: jax.Array  # bool
  success: jax.Array  # bool


def generate_map(key, params: FrozenLakeParams) -> jax.Array:
  """int8[n, n] random map with a start-goal path (see module docstring)."""
  n, attempts = params.size, params.num_map_attempts
  k_holes, k_start, k_goal = jax.random.split(key, 3)
  cell_F = jnp.arange(n * n)
  holes_AF = jax.random.uniform(k_holes, (attempts, n * n)) >= params.p_frozen
  start_A = jax.random.randint(k_start, (attempts,), 0, n * n)
  goal_A = jax.random.randint(k_goal, (attempts,), 0, n * n - 1)
  goal_A = goal_A + (goal_A >= start_A)
  desc_AF = jnp.where(holes_AF, HOLE, FROZEN)
  desc_AF = jnp.where(cell_F == start_A[:, None], START, desc_AF)
  desc_AF = jnp.where(cell_F == goal_A[:, None], GOAL, desc_AF)
  reach_AF = jax.vmap(core.reachable)(
    (desc_AF != HOLE).reshape(attempts, n, n), (cell_F == start_A[:, None]).reshape(attempts, n, n)
  ).reshape(attempts, n * n)
  ok_A = jnp.take_along_axis(reach_AF, goal_A[:, None], axis=1)[:, 0]
  pick = jnp.argmax(ok_A)
  desc_F, start, goal = desc_AF[pick], start_A[pick], goal_A[pick]
  row_F, col_F = cell_F // n, cell_F % n
  (r0, c0), (r1, c1) = divmod(start, n), divmod(goal, n)
  on_path = ((row_F == r0) & (col_F >= jnp.minimum(c0, c1)) & (col_F <= jnp.maximum(c0, c1))) | (
    (col_F == c1) & (row_F >= jnp.minimum(r0, r1)) & (row_F <= jnp.maximum(r0, r1))
  )
  desc_F = jnp.where(~ok_A[pick] & on_path & (desc_F == HOLE), FROZEN, desc_F)
  return desc_F.reshape(n, n).astype(jnp.int8)


class FrozenLake(core.Environment):
  name = "frozenlake"
  instruction = (
    "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and zero-indexed "
    "coordinates for the start, goal, player, and any holes. Beware that the ice is slippery, so the agent "
    "might slide and end up in an unintended tile. Respond with a sequence of actions such as "
    "<answer>Left || Up || Up</answer>."
  )
  symbol_legend = (
    ("P", "player"),
    ("_", "empty"),
    ("O", "hole"),
    ("G", "goal"),
    ("X", "player in hole"),
    ("√", "player on goal"),
  )

  def default_params(self) -> FrozenLakeParams:
    return FrozenLakeParams()

  def check_params(self, params: FrozenLakeParams) -> None:
    if params.size < 2:
      raise ValueError(f"frozenlake: size must be >= 2, got {params.size}")
    if not 0.0 <= params.p_frozen <= 1.0 or not 0.0 <= params.success_rate <= 1.0:
      raise ValueError("frozenlake: p_frozen and success_rate must lie in [0, 1]")
    if params.num_map_attempts < 1 or params.max_steps < 1:
      raise ValueError("frozenlake: num_map_attempts and max_steps must be >= 1")

  def action_names(self, params) -> tuple[str, ...]:
    return ("Left", "Down", "Right", "Up")

  def reset_state(self, key, params: FrozenLakeParams) -> FrozenLakeState:
    desc = generate_map(key, params)
    start = jnp.argmax(desc.ravel() == START).astype(jnp.int32)
    return FrozenLakeState(
      desc=desc,
      player_pos=jnp.stack([start // params.size, start % params.size]),
      steps=jnp.int32(0),
      done=jnp.bool_(False),
      success=jnp.bool_(False),
    )

  def transition(self, key, state: FrozenLakeState, action, params: FrozenLakeParams):
    u = jax.random.uniform(key)  # below success_rate: as asked; above: either side, equal odds
    side = jnp.where(u - params.success_rate < (1 - params.success_rate) / 2, (action + 3) % 4, (action + 1) % 4)
    direction = jnp.where(u >= params.success_rate, side, action)
    position = jnp.clip(state.player_pos + jnp.asarray(MOVES)[jnp.clip(direction, 0, 3)], 0, params.size - 1)
    tile = state.desc[position[0], position[1]]
    steps = state.steps + 1
    success = tile == GOAL
    next_state = state.replace(
      player_pos=position,
      steps=steps,
      done=success | (tile == HOLE) | (steps >= params.max_steps),
      success=success,
    )
    return next_state, success.astype(jnp.float32), jnp.any(position != state.player_pos)

  def observation(self, state: FrozenLakeState, params) -> jax.Array:
    """int8[n, n] symbol codes (P _ O G X √ as 0..5)."""
    base = jnp.array([1, 1, 2, 3], jnp.int8)[state.desc]  # start shows as frozen
    tile = state.desc[state.player_pos[0], state.player_pos[1]]
    player = jnp.where(tile == HOLE, PLAYER_IN_HOLE, jnp.where(tile == GOAL, PLAYER_ON_GOAL, PLAYER))
    at_player = (jnp.arange(params.size)[:, None] == state.player_pos[0]) & (
      jnp.arange(params.size)[None, :] == state.player_pos[1]
    )
    return jnp.where(at_player, player, base).astype(jnp.int8)

  def template(self, params: FrozenLakeParams) -> text.Template:
    n = params.size
    cells = text.coordinate_texts(n, n)
    header = f"Coordinates: \nBoard size: {n} rows x {n} cols (zero-indexed).\nStart: "
    return (
      ((header,), cells, ("\nGoal: ",), cells, ("\nPlayer: ", "\nPlayer on goal: ", "\nPlayer in hole: "), cells)
      + (("\nHoles: ",),)
      + text.coordinate_list_slots(n, n, n * n - 2)
      + (("\nGrid Map: \n",),)
      + text.grid_slots(n, n, SYMBOLS)
    )

  def slot_choices(self, state: FrozenLakeState, params: FrozenLakeParams) -> jax.Array:
    n = params.size
    desc_F = state.desc.ravel()
    player = state.player_pos[0] * n + state.player_pos[1]
    tile = desc_F[player]
    holes = jnp.nonzero(desc_F == HOLE, size=n * n - 2, fill_value=-1)[0].astype(jnp.int32)
    return jnp.concatenate(
      [
        jnp.stack([0, jnp.argmax(desc_F == START), 0, jnp.argmax(desc_F == GOAL)]).astype(jnp.int32),
        jnp.stack([jnp.where(tile == GOAL, 1, jnp.where(tile == HOLE, 2, 0)), player]).astype(jnp.int32),
        jnp.where(holes[:1] >= 0, 0, -1),
        holes,
        jnp.zeros((1,), jnp.int32),
        text.grid_choices(self.observation(state, params)),
      ]
    )

  def render_text(self, state: FrozenLakeState, params=None) -> str:
    desc = np.asarray(state.desc)
    row, col = (int(v) for v in np.asarray(state.player_pos))
    player_label = {GOAL: "Player on goal", HOLE: "Player in hole"}.get(int(desc[row, col]), "Player")
    lines = [
      f"Board size: {desc.shape[0]} rows x {desc.shape[1]} cols (zero-indexed).",
      f"Start: {text.coordinate_list(desc == START)}",
      f"Goal: {text.coordinate_list(desc == GOAL)}",
      f"{player_label}: ({row}, {col})",
    ]
    if (desc == HOLE).any():
      lines.append(f"Holes: {text.coordinate_list(desc == HOLE)}")
    grid = np.where(desc == HOLE, "O", np.where(desc == GOAL, "G", "_")).astype(object)
    grid[row, col] = {GOAL: "√", HOLE: "X"}.get(int(desc[row, col]), "P")
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + "\n".join("".join(r) for r in grid)
