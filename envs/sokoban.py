"""Sokoban (RAGEN's CoordSokoban) on device, with gym-sokoban's dynamics and rewards.

Encodings are gym-sokoban's. `room_fixed`: 0 wall, 1 floor, 2 target.
`room_state`: 0 wall, 1 floor, 2 empty target, 3 box on target, 4 box, 5 player
(a player on a target is 5; the target stays in `room_fixed`). Actions 0..3 are
Up, Down, Left, Right (gym-sokoban's push actions 1..4). Rewards: -0.1 per
step, +1 when a box reaches a target, -1 when one leaves it, +10 when all are
placed; the episode ends when solved or after `max_steps` steps. Rooms are
enclosed by walls (the generator guarantees it; the flat-index moves rely on it).

Room generation is gym-sokoban's reverse play, vectorised with static shapes.
`num_layouts` layouts are drawn at once: a random walk stamps 3x3 floor masks
(gym's room_topology_generation), then the player and the boxes, each on its
own target, go on distinct random floor cells. The first
`num_searched_layouts` plausible ones (see `_layout`) are reverse-played:
`num_reverse_walks` random walks of `search_depth` moves each, where the player
steps and pulls the box behind it (RAGEN's search tries only pulling moves),
keeping the configuration with the best gym score (number of box changes x
total box displacement, counted only when no box and not the player covers a
target). Reverse moves undo forward pushes, so every room is solvable. The
first layout whose best configuration uncovers every target is used; failing
that, the first that moved some box off the targets (left partly placed; this
happens with several boxes and a short search); failing that, the first
layout, already solved (none in 65,536 default rooms when measured). Small random
choices come from 16-bit slices of random words (bias below n / 65536).

Observation text (RAGEN `grid_coord` format; lines with no entity are left out):

    Coordinates: \\n
    Board size: 6 rows x 6 cols (zero-indexed).
    Targets: (4, 2)
    Boxes: (2, 3)
    Boxes on target: ...
    Player: (1, 3)          <- or "Player on target: (r, c)"
    Grid Map: \\n
    ######
    ...

(the two header lines end in a space, as in RAGEN's code). Grid symbols:
`#` wall, `_` empty, `O` target, `√` box on target, `X` box, `P` player,
`S` player on target; the numeric observation uses codes 0..6 in that order.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs import core, text

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
SYMBOLS = ("#", "_", "O", "√", "X", "P", "S")
MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)  # Up, Down, Left, Right
# gym-sokoban's room_topology_generation: walk directions and 3x3 floor masks.
_WALK_DIRECTIONS = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], np.int32)
_FLOOR_MASKS = np.array(
  [
    [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
    [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
    [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
  ],
  bool,
)


@struct.dataclass
class SokobanParams:
  dim_room: tuple[int, int] = struct.field(pytree_node=False, default=(6, 6))
  num_boxes: int = struct.field(pytree_node=False, default=1)
  num_gen_steps: int | None = struct.field(pytree_node=False, default=None)  # None: int(1.7 * (H + W))
  search_depth: int = struct.field(pytree_node=False, default=100)
  num_reverse_walks: int = struct.field(pytree_node=False, default=4)
  num_layouts: int = struct.field(pytree_node=False, default=6)
  num_searched_layouts: int = struct.field(pytree_node=False, default=2)
  p_change_directions: float = 0.35
  max_steps: int = 100
  step_penalty: float = -0.1
  box_on_target_reward: float = 1.0
  box_off_target_penalty: float = -1.0
  finished_reward: float = 10.0


@struct.dataclass
class SokobanState:
  room_fixed: jax.Array  # int8[H, W]
  room_state: jax.Array  # int8[H, W]
  player_pos: jax.Array  # int32[2] (row, col)
  boxes_on_target: jax.Array  # int32
  steps: jax.Array  # int32
  done: jax.Array  # bool
  success: jax.Array  # bool


@struct.dataclass
class _Placement:
  player: jax.Array  # int32 flat cell
  boxes_N: jax.Array  # int32[N] flat cells; box n started on target n
  score: jax.Array  # int32 `_room_score`


def _mask_stamps(rows: int, cols: int) -> np.ndarray:
  """bool[(rows-2)*(cols-2), 5, rows*cols]: each floor mask centred on each interior
  cell, clipped to the interior (the room's border stays wall)."""
  stamps = np.zeros(((rows - 2) * (cols - 2), len(_FLOOR_MASKS), rows, cols), bool)
  for r in range(1, rows - 1):
    for c in range(1, cols - 1):
      stamps[(r - 1) * (cols - 2) + c - 1, :, r - 1 : r + 2, c - 1 : c + 2] = _FLOOR_MASKS
  stamps[:, :, [0, -1], :] = False
  stamps[:, :, :, [0, -1]] = False
  return stamps.reshape(stamps.shape[0], len(_FLOOR_MASKS), rows * cols)


def _uniform16(key, count: int) -> jax.Array:
  """`count` uniforms in [0, 1) with 16-bit resolution, two per random 32-bit word.

  Generation needs ~100 small draws per layout and threefry dominated its
  cost; the 16-bit grid biases an n-way choice by at most n / 65536.
  """
  words = jax.random.bits(key, (-(-count // 2),), jnp.uint32)
  halves = jnp.stack([words & 0xFFFF, words >> 16], axis=-1).ravel()[:count]
  return halves.astype(jnp.float32) / 65536.0


def _choose(u: jax.Array, n) -> jax.Array:
  """Uniform integer in [0, n) from a uniform u in [0, 1)."""
  return jnp.floor(u * n).astype(jnp.int32)


def _random_directions(key, count: int) -> jax.Array:
  """`count` uniform draws from {0, 1, 2, 3}, 16 per random 32-bit word."""
  words = jax.random.bits(key, (-(-count // 16),), jnp.uint32)
  return ((words[:, None] >> (2 * jnp.arange(16, dtype=jnp.uint32))) & 3).ravel()[:count].astype(jnp.int32)


def _carve_floor(u_D: jax.Array, params: SokobanParams) -> jax.Array:
  """gym-sokoban's room_topology_generation: bool[H*W] floor, walls on the border.

  u_D holds 3 + 3 * num_gen_steps uniforms (start, then per step: change?,
  new direction, mask).
  """
  rows, cols = params.dim_room
  directions = jnp.asarray(_WALK_DIRECTIONS)
  start = jnp.stack([1 + _choose(u_D[0], rows - 1), 1 + _choose(u_D[1], cols - 1)])
  u_S3 = u_D[3:].reshape(-1, 3)
  change_S = u_S3[:, 0] < params.p_change_directions
  new_direction_S, mask_S = _choose(u_S3[:, 1], 4), _choose(u_S3[:, 2], len(_FLOOR_MASKS))

  def walk(carry, draw):
    position, direction = carry
    change, new_direction = draw
    direction = jnp.where(change, directions[new_direction], direction)
    position = jnp.clip(position + direction, 1, jnp.array([rows - 2, cols - 2]))
    return (position, direction), position

  init = (start, directions[_choose(u_D[2], 4)])
  _, position_S2 = jax.lax.scan(walk, init, (change_S, new_direction_S))
  cell_S = (position_S2[:, 0] - 1) * (cols - 2) + position_S2[:, 1] - 1
  return jnp.any(jnp.asarray(_mask_stamps(rows, cols))[cell_S, mask_S], axis=0)


def _manhattan(rows: int, cols: int) -> np.ndarray:
  """int32[H*W, H*W] Manhattan distance between flat cells."""
  row_F, col_F = np.divmod(np.arange(rows * cols), cols)
  return (np.abs(row_F[:, None] - row_F) + np.abs(col_F[:, None] - col_F)).astype(np.int32)


_ALL_UNCOVERED = 1 << 20  # score offset of configurations gym-sokoban accepts


def _room_score(boxes_N, player, targets_N, swaps, distance_to_targets_NF) -> jax.Array:
  """Rank of a reverse-play configuration (higher is better).

  gym-sokoban's score (box changes x total displacement) offset by 2^20 when no
  box and not the player covers a target (the only rooms gym accepts); else
  the displacement while some box is off the targets; 0 for a solved room.
  """
  displacement = jnp.sum(jnp.take_along_axis(distance_to_targets_NF, boxes_N[:, None], axis=1))
  on_target_N = jnp.any(boxes_N[:, None] == targets_N[None, :], axis=1)
  covered = jnp.any(on_target_N) | jnp.any(player == targets_N)
  return jnp.where(covered, jnp.where(jnp.all(on_target_N), 0, displacement), _ALL_UNCOVERED + swaps * displacement)


def _reverse_walk(key, floor_F, start: _Placement, params: SokobanParams) -> _Placement:
  """Reverse play from the solved room; returns the best placement along the walk."""
  cols = params.dim_room[1]
  deltas = jnp.array([-cols, cols, -1, 1], jnp.int32)
  targets_N = start.boxes_N
  distance_NF = jnp.asarray(_manhattan(*params.dim_room))[targets_N]

  def move(carry, direction):
    player, boxes_N, last_pulled, swaps, best = carry
    delta = deltas[direction]
    ahead = player + delta
    free = floor_F[ahead] & ~jnp.any(boxes_N == ahead)
    pulled_N = free & (boxes_N == player - delta)
    pulled, which = jnp.any(pulled_N), jnp.argmax(pulled_N)
    boxes_N = jnp.where(pulled_N, player, boxes_N)
    player = jnp.where(free, ahead, player)
    swaps = swaps + (pulled & (which != last_pulled))
    last_pulled = jnp.where(pulled, which, last_pulled)
    here = _Placement(player=player, boxes_N=boxes_N, score=_room_score(boxes_N, player, targets_N, swaps, distance_NF))
    best = jax.tree.map(lambda b, h: jnp.where(here.score > best.score, h, b), best, here)
    return (player, boxes_N, last_pulled, swaps, best), None

  init = (start.player, start.boxes_N, jnp.int32(-1), jnp.int32(0), start)
  (*_, best), _ = jax.lax.scan(move, init, _random_directions(key, params.search_depth))
  return best


def _layout(key, params: SokobanParams):
  """Carve a room and place player and boxes (on their targets) on distinct floor cells.

  Returns (floor bool[H*W], player int32, targets int32[N], plausible bool). A
  layout is plausible when it has room for everything, every box has a
  direction it can be pulled in (two floor cells in a line) and the player
  can walk to one such pull; reverse play needs all three to uncover every
  target, so skipping implausible layouts does not bias the rooms.
  """
  rows, cols = params.dim_room
  steps = params.num_gen_steps or int(1.7 * (rows + cols))
  u_D = _uniform16(key, 3 + 3 * steps + params.num_boxes + 1)
  floor_F = _carve_floor(u_D[: 3 + 3 * steps], params)
  free_F, count = floor_F, jnp.sum(floor_F)
  cells = []  # the player, then the boxes
  for j, u in enumerate(u_D[3 + 3 * steps :]):
    rank = _choose(u, count - j)
    cells.append(jnp.argmax(free_F & (jnp.cumsum(free_F) - 1 == rank)).astype(jnp.int32))
    free_F = free_F.at[cells[-1]].set(False)
  cells = jnp.stack(cells)
  step_4 = jnp.array([-cols, cols, -1, 1], jnp.int32)
  near_N4, far_N4 = (jnp.clip(cells[1:, None] + k * step_4, 0, rows * cols - 1) for k in (1, 2))
  pullable_N4 = floor_F[near_N4] & floor_F[far_N4]
  walkable_F = free_F.at[cells[0]].set(True)
  start_F = jnp.arange(rows * cols) == cells[0]
  reach_F = core.reachable(walkable_F.reshape(rows, cols), start_F.reshape(rows, cols), (rows - 2) * (cols - 2))
  first_pull = jnp.any(pullable_N4 & reach_F.ravel()[near_N4] & walkable_F[far_N4])
  plausible = jnp.all(jnp.any(pullable_N4, axis=1)) & first_pull & (count > params.num_boxes + 1)
  return floor_F, cells[0], cells[1:], plausible


def _search(key, floor_F, player, targets_N, params: SokobanParams) -> _Placement:
  """Best placement over `num_reverse_walks` parallel reverse walks."""
  start = _Placement(player=player, boxes_N=targets_N, score=jnp.int32(0))
  walks = jax.vmap(_reverse_walk, in_axes=(0, None, None, None))(
    jax.random.split(key, params.num_reverse_walks), floor_F, start, params
  )
  return jax.tree.map(lambda x: x[jnp.argmax(walks.score)], walks)


def generate_room(key, params: SokobanParams) -> tuple[jax.Array, jax.Array]:
  """(room_fixed int8[H, W], room_state int8[H, W]) by vectorised reverse play.

  `num_layouts` layouts are drawn; the first `num_searched_layouts` plausible
  ones are reverse-played and the first whose best configuration uncovers
  every target is kept. Failing that, the first that moved some box off the
  targets; failing that (no box could move), the first layout, solved.
  """
  k_layout, k_search = jax.random.split(key)
  floor_LF, player_L, targets_LN, plausible_L = jax.vmap(_layout, in_axes=(0, None))(
    jax.random.split(k_layout, params.num_layouts), params
  )
  chosen_K = jnp.nonzero(plausible_L, size=params.num_searched_layouts, fill_value=0)[0]
  best_K = jax.vmap(_search, in_axes=(0, 0, 0, 0, None))(
    jax.random.split(k_search, params.num_searched_layouts),
    floor_LF[chosen_K],
    player_L[chosen_K],
    targets_LN[chosen_K],
    params,
  )
  tier_K = jnp.where(best_K.score >= _ALL_UNCOVERED, 2, jnp.where(best_K.score > 0, 1, 0))
  pick = jnp.argmax(jnp.where(plausible_L[chosen_K], tier_K, -1))
  floor_F, targets_N = floor_LF[chosen_K[pick]], targets_LN[chosen_K[pick]]
  player, boxes_N = best_K.player[pick], best_K.boxes_N[pick]
  fixed_F = jnp.where(floor_F, FLOOR, WALL).astype(jnp.int8).at[targets_N].set(TARGET)
  box_codes = jnp.where(fixed_F[boxes_N] == TARGET, BOX_ON_TARGET, BOX).astype(jnp.int8)
  state_F = fixed_F.at[boxes_N].set(box_codes).at[player].set(PLAYER)
  return fixed_F.reshape(params.dim_room), state_F.reshape(params.dim_room)


class Sokoban(core.Environment):
  name = "sokoban"
  instruction = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
    "When you are right next to a box, you can push it by moving in the same direction. "
    "You cannot push a box through a wall, and you cannot pull a box. "
    "The observation includes both a symbol grid and zero-indexed coordinates for the targets, boxes and player. "
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>"
  )
  symbol_legend = (
    ("#", "wall"),
    ("_", "empty"),
    ("O", "target"),
    ("√", "box on target"),
    ("X", "box"),
    ("P", "player"),
    ("S", "player on target"),
  )

  def default_params(self) -> SokobanParams:
    return SokobanParams()

  def check_params(self, params: SokobanParams) -> None:
    rows, cols = params.dim_room
    if rows < 3 or cols < 3:
      raise ValueError(f"sokoban: dim_room must be at least (3, 3), got {params.dim_room}")
    if not 1 <= params.num_boxes <= (rows - 2) * (cols - 2) - 2:
      raise ValueError(f"sokoban: num_boxes={params.num_boxes} does not fit a {rows}x{cols} room")
    for field in ("search_depth", "num_reverse_walks", "num_searched_layouts", "max_steps"):
      if getattr(params, field) < 1:
        raise ValueError(f"sokoban: {field} must be >= 1")
    if params.num_layouts < params.num_searched_layouts:
      raise ValueError("sokoban: num_layouts must be >= num_searched_layouts")

  def action_names(self, params) -> tuple[str, ...]:
    return ("Up", "Down", "Left", "Right")

  def reset_state(self, key, params: SokobanParams) -> SokobanState:
    room_fixed, room_state = generate_room(key, params)
    player = jnp.argmax(room_state.ravel() == PLAYER).astype(jnp.int32)
    cols = params.dim_room[1]
    on_target = jnp.sum(room_state == BOX_ON_TARGET).astype(jnp.int32)
    return SokobanState(
      room_fixed=room_fixed,
      room_state=room_state,
      player_pos=jnp.stack([player // cols, player % cols]),
      boxes_on_target=on_target,
      steps=jnp.int32(0),
      done=jnp.bool_(False),
      success=on_target == params.num_boxes,
    )

  def transition(self, key, state: SokobanState, action, params: SokobanParams):
    rows, cols = params.dim_room
    move = jnp.asarray(MOVES)[jnp.clip(action, 0, 3)]
    ahead, beyond = state.player_pos + move, state.player_pos + 2 * move
    beyond_inside = jnp.all(beyond < jnp.array([rows, cols]))  # gym-sokoban checks only this side
    beyond = jnp.clip(beyond, 0, jnp.array([rows - 1, cols - 1]))
    here_i, ahead_i, beyond_i = (p[0] * cols + p[1] for p in (state.player_pos, ahead, beyond))
    room_F, fixed_F = state.room_state.ravel(), state.room_fixed.ravel()
    ahead_cell, beyond_cell = room_F[ahead_i], room_F[beyond_i]
    ahead_free = (ahead_cell == FLOOR) | (ahead_cell == TARGET)
    push = (ahead_cell == BOX_ON_TARGET) | (ahead_cell == BOX)
    push &= (beyond_cell == FLOOR) | (beyond_cell == TARGET)
    moved = beyond_inside & (push | ahead_free)
    push &= beyond_inside

    box_code = jnp.where(fixed_F[beyond_i] == TARGET, BOX_ON_TARGET, BOX).astype(jnp.int8)
    room_F = room_F.at[beyond_i].set(jnp.where(push, box_code, beyond_cell))
    room_F = room_F.at[here_i].set(jnp.where(moved, fixed_F[here_i], room_F[here_i]))
    room_F = room_F.at[ahead_i].set(jnp.where(moved, jnp.int8(PLAYER), room_F[ahead_i]))
    room_state = room_F.reshape(rows, cols)

    # gym-sokoban recounts the uncovered targets; only a push changes the count
    on_target = state.boxes_on_target + (push & (fixed_F[beyond_i] == TARGET)) - (push & (fixed_F[ahead_i] == TARGET))
    solved = on_target == params.num_boxes
    reward = (
      params.step_penalty
      + jnp.where(on_target > state.boxes_on_target, params.box_on_target_reward, 0.0)
      + jnp.where(on_target < state.boxes_on_target, params.box_off_target_penalty, 0.0)
      + jnp.where(solved, params.finished_reward, 0.0)
    )
    steps = state.steps + 1
    next_state = state.replace(
      room_state=room_state,
      player_pos=jnp.where(moved, ahead, state.player_pos),
      boxes_on_target=on_target,
      steps=steps,
      done=solved | (steps >= params.max_steps),
      success=solved,
    )
    return next_state, reward, moved

  def observation(self, state: SokobanState, params) -> jax.Array:
    """int8[H, W] symbol codes (room_state with 6 for a player on a target)."""
    on_target = (state.room_state == PLAYER) & (state.room_fixed == TARGET)
    return jnp.where(on_target, PLAYER_ON_TARGET, state.room_state).astype(jnp.int8)

  def template(self, params: SokobanParams) -> text.Template:
    rows, cols = params.dim_room
    boxes = text.coordinate_list_slots(rows, cols, params.num_boxes)
    header = f"Coordinates: \nBoard size: {rows} rows x {cols} cols (zero-indexed).\nTargets: "
    return (
      ((header,),)
      + boxes
      + (("\nBoxes: ",),)
      + boxes
      + (("\nBoxes on target: ",),)
      + boxes
      + (("\nPlayer: ", "\nPlayer on target: "), text.coordinate_texts(rows, cols), ("\nGrid Map: \n",))
      + text.grid_slots(rows, cols, SYMBOLS)
    )

  def slot_choices(self, state: SokobanState, params: SokobanParams) -> jax.Array:
    cols, count = params.dim_room[1], params.num_boxes
    fixed_F, room_F = state.room_fixed.ravel(), state.room_state.ravel()

    def listing(mask_F):
      cells = jnp.nonzero(mask_F, size=count, fill_value=-1)[0].astype(jnp.int32)
      return jnp.concatenate([jnp.where(cells[:1] >= 0, 0, -1), cells])

    player = state.player_pos[0] * cols + state.player_pos[1]
    return jnp.concatenate(
      [
        jnp.zeros((1,), jnp.int32),
        listing(fixed_F == TARGET)[1:],
        listing(room_F == BOX),
        listing(room_F == BOX_ON_TARGET),
        jnp.stack([(fixed_F[player] == TARGET).astype(jnp.int32), player, jnp.int32(0)]),
        text.grid_choices(self.observation(state, params)),
      ]
    )

  def render_text(self, state: SokobanState, params=None) -> str:
    room_state, room_fixed = np.asarray(state.room_state), np.asarray(state.room_fixed)
    player = room_state == PLAYER
    lines = [f"Board size: {room_state.shape[0]} rows x {room_state.shape[1]} cols (zero-indexed)."]
    for label, mask in (
      ("Targets", room_fixed == TARGET),
      ("Boxes", room_state == BOX),
      ("Boxes on target", room_state == BOX_ON_TARGET),
      ("Player", player & (room_fixed != TARGET)),
      ("Player on target", player & (room_fixed == TARGET)),
    ):
      if mask.any():
        lines.append(f"{label}: {text.coordinate_list(mask)}")
    grid = np.where(player & (room_fixed == TARGET), PLAYER_ON_TARGET, room_state)
    rows = "\n".join("".join(SYMBOLS[v] for v in row) for row in grid)
    return "Coordinates: \n" + "\n".join(lines) + "\nGrid Map: \n" + rows
