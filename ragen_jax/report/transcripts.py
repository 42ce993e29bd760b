"""Transcripts: a few episodes of a `Trajectories` batch decoded into readable records.

An episode's record is {seed, score, success, system, turns}: `system` the system prompt, and per turn
{prompt, reply, actions, reward, format_ok}, where `prompt` is the text the model read before its reply
(the first user message; later, the previous turn's reward and the new observation) and `reply` what it
generated, both decoded with the chat template's special tokens, exactly as the model saw and wrote them.
`reward` and `format_ok` are the rollout's. The trajectories do not keep the parsed actions, so `actions`
is the reply parsed again on the host by the reference parser of the answer grammar (`envs.text`), which
agrees with the device parser on decoded replies (tests/envs/test_envs_text.py fuzzes it): the names of the
recognised actions ("?" for an unknown one an environment steps anyway), or for a host text environment the
answer it scores.
"""

from __future__ import annotations

import jax
import numpy as np

from envs import text as env_text
from envs.host import extract_answer
from ragen_jax import mesh as mesh_lib
from ragen_jax.rollout.episodes import reset_batch, unbatch
from ragen_jax.rollout.source import DeviceSource

TRANSCRIPT_FIELDS = ("tokens", "valid", "loss_mask", "turn_of_token", "segment_ids", "turn_rewards", "format_ok",
                     "num_turns", "score", "success")


def first_episodes(traj, count: int) -> dict[str, np.ndarray]:
  """Host copies of the fields transcripts need, of the first `count` episodes (a gather: call it from every
  process)."""
  return mesh_lib.fetch({name: getattr(traj, name)[:count] for name in TRANSCRIPT_FIELDS})


def _action_names(env, env_params, seeds) -> list[tuple[str, ...]]:
  names = env.action_names(env_params)
  if names is not None:
    return [names] * len(seeds)
  states = jax.device_get(reset_batch(env, env_params, np.asarray(seeds, np.int32)))  # names drawn per episode
  return [env.episode_action_names(unbatch(states, i), env_params) for i in range(len(seeds))]


def decode_episodes(source, tokenizer, episodes: dict[str, np.ndarray], seeds) -> list[dict]:
  """Records (module docstring) of the episodes of `first_episodes`, played by `source` from `seeds`."""
  config = source.config
  decode = lambda ids: tokenizer.decode(ids.tolist())  # noqa: E731
  if isinstance(source, DeviceSource):
    names = _action_names(source.env, source.env_params, seeds)
    keep_unknown = source.env.keep_unknown_actions

    def actions(turn, i):
      ids, _ = env_text.parse_actions_text(turn, names[i], config.max_actions_per_turn, keep_unknown,
                                           config.enable_think)
      return [names[i][a] if a >= 0 else "?" for a in ids]
  else:
    def actions(turn, _):
      answer = extract_answer(turn, config.enable_think)
      return [] if answer is None else [answer]

  records = []
  for i, seed in enumerate(seeds):
    tokens, valid, generated, turn_of_token = (episodes[name][i] for name in ("tokens", "valid", "loss_mask",
                                                                              "turn_of_token"))
    system = valid & (episodes["segment_ids"][i] == 0)
    turns = []
    for k in range(int(episodes["num_turns"][i])):
      reply = decode(tokens[generated & (turn_of_token == k)])
      turns.append({"prompt": decode(tokens[valid & ~system & ~generated & (turn_of_token == k)]), "reply": reply,
                    "actions": actions(env_text.THINK_OPEN + reply, i),
                    "reward": round(float(episodes["turn_rewards"][i, k]), 6),
                    "format_ok": bool(episodes["format_ok"][i, k])})
    records.append({"seed": int(seed), "score": round(float(episodes["score"][i]), 6),
                    "success": bool(episodes["success"][i]), "system": decode(tokens[system]), "turns": turns})
  return records


def _shown(text: str, max_chars: int | None) -> str:
  """`text` safe for a terminal (control characters escaped), shortened to about `max_chars` keeping both ends."""
  text = "".join(c if c.isprintable() or c in "\n\t" else ascii(c)[1:-1] for c in text)
  if max_chars is None or len(text) <= max_chars:
    return text
  half = max_chars // 2
  return f"{text[:half]} [... {len(text) - 2 * half} characters ...] {text[-half:]}"


def transcript_text(record: dict, compact: bool = False, max_chars: int | None = None) -> str:
  """A record as plain text, turn by turn, control characters escaped; `compact` leaves out the system prompt and
  the prompts after the first, `max_chars` shortens each prompt and reply (keeping both ends)."""
  outcome = "solved" if record["success"] else "not solved"
  lines = [f"seed {record['seed']}: score {record['score']:.2f}, {outcome}, {len(record['turns'])} turn(s)"]
  if not compact:
    lines += ["--- system prompt", _shown(record["system"], max_chars)]
  for k, turn in enumerate(record["turns"], 1):
    if k == 1 or not compact:
      lines += [f"--- turn {k} prompt", _shown(turn["prompt"], max_chars)]
    actions = ", ".join(turn["actions"]) or "none"
    lines += [f"--- turn {k} reply (actions: {actions}; reward {turn['reward']:.2f}; "
              f"{'format ok' if turn['format_ok'] else 'format penalty'})", _shown(turn["reply"], max_chars)]
  return "\n".join(lines)

