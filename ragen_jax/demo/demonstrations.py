"""Solver demonstrations in the reference reply format, with input-dependent reasoning.

A scripted policy plays episodes through the host rollout path, so the
demonstrations have exactly the token layout the model later sees in RL. Each
reply names the positions that matter and the moves chosen from a BFS plan
(Bandit: names the two arms and pulls the high-risk one, of the higher mean payout);
a share of turns deliberately makes one move only or starts with a wrong move,
habitual or random (RL then has room to improve).
`format_rows` builds replies with random moves for the first SFT stages, which teach
the answer to repeat the moves the reasoning chose and the reasoning to read the
positions off the observation.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import jax
import numpy as np

from envs import solvers
from envs.text import ANSWER_OPEN
from ragen_jax.rollout.episodes import unbatch
from ragen_jax.rollout.prompt import THINK_OPEN


def _cells(mask) -> str:
  return ", ".join(f"({r}, {c})" for r, c in zip(*np.nonzero(np.asarray(mask)))) or "none"


def direction_text(dr: int, dc: int) -> str:
  """'2 down 1 left' for a (row, column) displacement; 'here' for none."""
  parts = ([f"{abs(dr)} {'down' if dr > 0 else 'up'}"] if dr else []) + (
      [f"{abs(dc)} {'right' if dc > 0 else 'left'}"] if dc else [])
  return " ".join(parts) or "here"


def _sokoban_why(boxes, targets, player, plan, action_names) -> str:
  """Where each box must go (to its nearest free target) and the plan's next push."""
  free = list(zip(*np.nonzero(targets & ~boxes)))
  goes = [direction_text(*min(((tr - br, tc - bc) for tr, tc in free), key=lambda d: abs(d[0]) + abs(d[1])))
          for br, bc in zip(*np.nonzero(boxes & ~targets))] if free else []
  (row, col), push = player, "none"
  for action in plan:
    dr, dc = solvers.SOKOBAN_MOVES[action]
    row, col = row + dr, col + dc
    if boxes[row, col]:
      push = action_names[action]
      break
  return f"box goes {', '.join(goes) or 'here'}; next push {push}"


def plan_and_reason(env_name: str, state, action_names) -> tuple[list[int], str]:
  """(BFS plan, reasoning text) for one env state: the relevant positions and why the moves.

  Sokoban: where the box must go and the plan's next push; FrozenLake: where the goal lies and the
  holes next to the player; Bandit: the two arms' names, and the high-risk arm (mean payout 0.25 against 0.1).
  """
  if env_name == "bandit":
    return [int(state.high_risk_arm)], f"arms {action_names[0]} and {action_names[1]}."
  row, col = (int(v) for v in np.asarray(state.player_pos))
  if env_name == "sokoban":
    fixed, room = np.asarray(state.room_fixed), np.asarray(state.room_state)
    plan = solvers.solve_sokoban(fixed, room, (row, col)) or []
    boxes, targets = (room == 4) | (room == 3), (fixed == 2)
    why = _sokoban_why(boxes, targets, (row, col), plan, action_names)
    return plan, f"player ({row}, {col}), box {_cells(boxes)}, target {_cells(targets)}: {why}."
  if env_name == "frozenlake":
    desc = np.asarray(state.desc)
    plan = solvers.solve_frozenlake(desc, (row, col)) or []
    near = np.zeros_like(desc, bool)
    for dr, dc in solvers.FROZENLAKE_MOVES:
      if 0 <= row + dr < desc.shape[0] and 0 <= col + dc < desc.shape[1]:
        near[row + dr, col + dc] = True
    (goal_row, goal_col), = zip(*np.nonzero(desc == 3))
    goal_direction = direction_text(goal_row - row, goal_col - col)
    return plan, (f"player ({row}, {col}), goal ({goal_row}, {goal_col}) is {goal_direction}, "
                  f"holes near {_cells(near & (desc == 2))}.")
  raise ValueError(f"no demonstrations for environment {env_name!r}")


_COORDINATE = r"\((\d+), (\d+)\)"
# per environment, (observation pattern, reasoning pattern) pairs: a reply reads its observation when each pair
# matches with the same groups (Sokoban and FrozenLake: positions, the first listed one where the observation
# lists several; Bandit: the two arms' names, in the observation's order)
READ_PATTERNS = {"sokoban": ((rf"Player[a-z ]*: {_COORDINATE}", rf"\bplayer {_COORDINATE}"),
                             (rf"Boxes[a-z ]*: {_COORDINATE}", rf"\bbox {_COORDINATE}")),
                 "frozenlake": ((rf"Player[a-z ]*: {_COORDINATE}", rf"\bplayer {_COORDINATE}"),
                                (rf"Goal[a-z ]*: {_COORDINATE}", rf"\bgoal {_COORDINATE}")),
                 "bandit": ((r"named (\w+) and (\w+)", r"\barms (\w+) and (\w+)"),)}
READING_KEYS = ("positions_read", "answer_follows_reasoning")  # what `reading_rates` returns


def reply_checks(env_name: str, observation: str, reply: str) -> tuple[bool, bool]:
  """(the reasoning names what `READ_PATTERNS` reads off the observation, the answer repeats the reasoning's
  moves) of one turn. The moves are those after "So:" in the reply format of `reply_text`.
  """
  matches = [(re.search(shown, observation), re.search(said, reply)) for shown, said in READ_PATTERNS[env_name]]
  moves = re.search(r"So: (.*?)\.</think><answer>(.*?)</answer>", reply)
  return (all(a and b and a.groups() == b.groups() for a, b in matches),
          bool(moves and moves.group(1) == moves.group(2)))


def reading_rates(env_name: str, traj, tokenizer) -> dict[str, float]:
  """Shares of the turns in `traj` (host arrays) whose reasoning names the observation's positions
  (`positions_read`) and whose answer repeats the reasoning's moves (`answer_follows_reasoning`).

  The observation of a turn is the text between the previous reply and this one.
  """
  checks = []
  for b in range(len(traj.num_turns)):
    previous_end = 0
    for k in range(int(traj.num_turns[b])):
      start, end = int(traj.response_start[b, k]), int(traj.response_start[b, k] + traj.response_len[b, k])
      checks.append(reply_checks(env_name, tokenizer.decode(traj.tokens[b, previous_end:start]),
                                 tokenizer.decode(traj.tokens[b, start:end])))
      previous_end = end
  rates = np.mean(checks, axis=0) if checks else (np.nan, np.nan)
  return dict(zip(READING_KEYS, map(float, rates)))


def reply_text(reasoning: str, move_names, moves_in_reasoning: bool = True) -> str:
  """A reply in the reference format: reasoning, the chosen moves (unless not `moves_in_reasoning`), then the
  answer."""
  answer = " || ".join(move_names)
  return f"{reasoning}{f' So: {answer}.' if moves_in_reasoning else ''}</think><answer>{answer}</answer>"


def format_rows(states, tokenizer, *, observed: bool, rows: int, row_len: int, max_moves: int, seed: int = 0):
  """`rows` (token ids, loss mask) pairs of up to `row_len` tokens in the reply format, for the first SFT stages.

  `states` lists (observation text, reasoning, action names). Every reply takes 1 to `max_moves` random
  moves, so its answer can be predicted only by repeating the moves the reasoning chose. Rows that are not
  `observed` pack replies without their observations, with the loss on the answers; `observed` rows hold
  one observation and its reply, with the loss on the reply, whose positions are read off the
  observation. SFT on the demonstrations alone learns these copies late or not at all (docs/results.md).
  """
  rng = np.random.default_rng(seed)
  answer_open = tokenizer.convert_tokens_to_ids(ANSWER_OPEN)

  def random_reply():
    observation, reasoning, names = states[int(rng.integers(len(states)))]
    moves = [names[a] for a in rng.integers(len(names), size=int(rng.integers(1, max_moves + 1)))]
    return observation, tokenizer.encode(reply_text(reasoning, moves)) + [tokenizer.eos_token_id]

  packed = []
  for _ in range(rows):
    if observed:
      observation, reply = random_reply()
      context = tokenizer.encode(f"{observation}\n{THINK_OPEN}")
      ids, mask = context + reply, [False] * len(context) + [True] * len(reply)
    else:
      ids, mask = [], []
      while True:
        reply = tokenizer.encode(THINK_OPEN) + random_reply()[1]
        if len(ids) + len(reply) > row_len:
          break
        answer_start = reply.index(answer_open) + 1
        ids += reply
        mask += [i >= answer_start for i in range(len(reply))]
    if not ids or len(ids) > row_len:
      raise ValueError(f"a format row needs more than row_len={row_len} tokens")
    packed.append((ids, mask))
  return packed


@dataclasses.dataclass
class ScriptedReplies:
  """The fields of `sampling.Generation` that the host rollout reads."""

  tokens_BN: np.ndarray
  lengths_B: np.ndarray
  ended_by_eos_B: np.ndarray
  model_logp_BN: np.ndarray


# input-agnostic reasoning per environment: what a `template_rate` share of demonstration turns say in place of
# the positions they read (a warm start with some template collapse already in it, for RL to grow or shrink)
TEMPLATES = {"sokoban": ("the box must reach the target.", "push the box toward the target.",
                         "walk around the box first.", "keep the box away from the walls."),
             "frozenlake": ("the goal is across the lake.", "walk toward the goal.", "stay away from the holes.",
                            "step carefully on the ice.")}
# The same role, in the words of real reading (`demo.template_style` "reading"): the reading of one made-up state,
# whatever the observation, fluent and as long as a reading, like the paper's templates. The demo's tokenizer
# learns each sentence template above as one token (they are in its corpus), so a reply with one is mostly answer
# tokens and its per-token entropy the answer's; these are not in the corpus and tokenise as readings do.
READING_TEMPLATES = {
    "sokoban": ("player (2, 2), box (2, 3), target (2, 4): box goes 1 right; next push Right.",
                "player (1, 3), box (2, 3), target (4, 3): box goes 2 down; next push Down.",
                "player (3, 4), box (3, 3), target (3, 1): box goes 2 left; next push Left.",
                "player (4, 2), box (3, 2), target (1, 2): box goes 2 up; next push Up."),
    "frozenlake": ("player (1, 1), goal (3, 3) is 2 down 2 right, holes near none.",
                   "player (0, 0), goal (2, 1) is 2 down 1 right, holes near (1, 0).",
                   "player (3, 2), goal (0, 2) is 3 up, holes near none.",
                   "player (2, 3), goal (2, 0) is 3 left, holes near (1, 3)."),
}
TEMPLATE_STYLES = {"sentence": TEMPLATES, "reading": READING_TEMPLATES}


def solver_policy(env, env_params, tokenizer, max_new_tokens: int, actions_per_turn: int, mistake_rate: float,
                  single_move_rate: float = 0.0, habit_move: str = "Up", seed: int = 0, template_rate: float = 0.0,
                  templates: int = 4, template_style: str = "sentence"):
  """A host-rollout policy that replies with the solver's next moves in `env` (action names per episode).

  Imperfections: a `single_move_rate` share of turns makes only the plan's first move (a hesitant
  player runs out of turns on longer levels), and a `mistake_rate` share starts with a wrong move in place of
  the plan's first move: the habit `habit_move` (another move where the plan starts with it), or with
  `habit_move` "" another move drawn at random (Bandit, whose actions are the episode's arm names: at 0.5 the
  arm pulled is a fair coin). The habit survives low-temperature sampling of the SFT policy, so RL has it to
  unlearn. A `template_rate` share of turns reasons with one of the first `templates` of the env's templates in
  `template_style` (`TEMPLATE_STYLES`), drawn at random, and nothing else: the same moves follow in the answer
  only, so the reasoning names nothing of the input.
  """
  rng = np.random.default_rng(seed)
  env_templates = TEMPLATE_STYLES[template_style].get(env.name, ())

  def policy(records, active, env_state, key):
    del records, key
    batch = len(active)
    tokens = np.zeros((batch, max_new_tokens), np.int32)
    lengths = np.zeros(batch, np.int32)
    env_state = jax.device_get(env_state)  # one copy to the host, not one per row and field
    for i in np.flatnonzero(active):
      state = unbatch(env_state, i)
      names = env.episode_action_names(state, env_params)
      plan, reasoning = plan_and_reason(env.name, state, names)
      templated = bool(template_rate) and rng.random() < template_rate  # no draw at 0: the demonstrations stay
      if templated:
        reasoning = env_templates[int(rng.integers(templates))]
      moves = list(plan[:1 if rng.random() < single_move_rate else actions_per_turn]) or [
          int(rng.integers(len(names)))]
      if rng.random() < mistake_rate:
        habit = names.index(habit_move) if habit_move else None
        if habit is not None and moves[0] != habit:
          moves[0] = habit
        else:  # the plan starts with the habit, or there is no habit: another move, at random
          moves[0] = int(rng.choice([a for a in range(len(names)) if a != moves[0]]))
      ids = tokenizer.encode(reply_text(reasoning, [names[a] for a in moves], not templated)) + [
          tokenizer.eos_token_id]
      if len(ids) > max_new_tokens:
        raise ValueError(f"a demonstration reply has {len(ids)} tokens; raise rollout.max_new_tokens")
      tokens[i, :len(ids)], lengths[i] = ids, len(ids)
    return ScriptedReplies(tokens, lengths, active.copy(), np.zeros((batch, max_new_tokens), np.float32))

  return policy


def corpus(env_name: str, env, env_params, states, count: int) -> list[str]:
  """Text for training the demo tokenizer: observations and solver replies (all move pairs) of `count` states."""
  names = env.action_names(env_params)
  texts = []
  for i in range(count):
    state = unbatch(states, i)
    _, reasoning = plan_and_reason(env_name, state, names)
    texts.append(env.render_text(state, env_params))
    texts += [reply_text(reasoning, pair) for pair in itertools.product(names, repeat=2)]
  return texts
