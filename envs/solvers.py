"""Breadth-first solvers for the grid puzzles (host-side numpy), for demonstrations and checks."""

from __future__ import annotations

import collections

import numpy as np

# Sokoban action ids 0..3 = Up, Down, Left, Right; FrozenLake 0..3 = Left, Down, Right, Up.
SOKOBAN_MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
FROZENLAKE_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))
_WALL, _TARGET, _BOX_ON_TARGET, _BOX = 0, 2, 3, 4
_HOLE, _GOAL = 2, 3


def solve_sokoban(room_fixed, room_state, player_pos, max_steps: int = 200) -> list[int] | None:
  """Shortest action sequence (moves and pushes) that puts every box on a target, or None."""
  fixed, state = np.asarray(room_fixed), np.asarray(room_state)
  walls = fixed == _WALL
  targets = frozenset(zip(*np.nonzero(fixed == _TARGET)))
  boxes = frozenset(zip(*np.nonzero((state == _BOX) | (state == _BOX_ON_TARGET))))
  start = (tuple(int(x) for x in player_pos), boxes)
  parents = {start: None}
  queue = collections.deque([(start, 0)])
  while queue:
    (player, boxes), depth = queue.popleft()
    if boxes <= targets:
      return _unwind(parents, (player, boxes))
    if depth >= max_steps:
      continue
    for action, (dr, dc) in enumerate(SOKOBAN_MOVES):
      step = (player[0] + dr, player[1] + dc)
      if walls[step]:
        continue
      new_boxes = boxes
      if step in boxes:
        beyond = (step[0] + dr, step[1] + dc)
        if walls[beyond] or beyond in boxes:
          continue
        new_boxes = (boxes - {step}) | {beyond}
      node = (step, new_boxes)
      if node not in parents:
        parents[node] = ((player, boxes), action)
        queue.append((node, depth + 1))
  return None


def solve_frozenlake(desc, player_pos) -> list[int] | None:
  """Shortest action sequence to the goal avoiding holes (no slipping), or None."""
  desc = np.asarray(desc)
  size = desc.shape
  start = tuple(int(x) for x in player_pos)
  parents = {start: None}
  queue = collections.deque([start])
  while queue:
    cell = queue.popleft()
    if desc[cell] == _GOAL:
      return _unwind(parents, cell)
    if desc[cell] == _HOLE:
      continue
    for action, (dr, dc) in enumerate(FROZENLAKE_MOVES):
      nxt = (min(max(cell[0] + dr, 0), size[0] - 1), min(max(cell[1] + dc, 0), size[1] - 1))
      if nxt not in parents:
        parents[nxt] = (cell, action)
        queue.append(nxt)
  return None


def _unwind(parents, node) -> list[int]:
  actions = []
  while parents[node] is not None:
    node, action = parents[node]
    actions.append(action)
  return actions[::-1]
