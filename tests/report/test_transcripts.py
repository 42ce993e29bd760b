"""Transcripts: episodes decoded turn by turn, actions parsed again on the host, terminal-safe text."""

import jax
import numpy as np

import envs
from ragen_jax.report.transcripts import decode_episodes, transcript_text
from ragen_jax.rollout.episodes import RolloutConfig, reset_batch, unbatch
from ragen_jax.rollout.source import DeviceSource, TextSource

SYSTEM, PROMPTS = "<|im_start|>system\nplay\n", ("Turn 1:\nState:\nchoose\n<think>", "Reward:\n0\nTurn 2:\n<think>")


def episodes_of(tokenizer, replies_per_episode):
  """Packed episode fields (as `first_episodes` returns them) of a system prompt, then per turn a prompt and a reply."""
  rows = []
  for replies in replies_per_episode:
    pieces = [(SYSTEM, 0, 0, False)]
    for turn, reply in enumerate(replies):
      pieces += [(PROMPTS[turn], turn + 1, turn, False), (reply, turn + 1, turn, True)]
    rows.append([(i, segment, turn, generated) for piece, segment, turn, generated in pieces
                 for i in tokenizer.encode(piece)])
  width = max(map(len, rows)) + 3
  field = lambda index, fill, dtype: np.array([[t[index] for t in row] + [fill] * (width - len(row))  # noqa: E731
                                               for row in rows], dtype)
  batch, turns = len(rows), 2
  return {"tokens": field(0, 0, np.int32), "valid": field(0, -1, np.int32) >= 0, "segment_ids": field(1, 0, np.int32),
          "turn_of_token": field(2, -1, np.int32), "loss_mask": field(3, False, bool),
          "turn_rewards": np.array([[0.5, -0.1]] * batch, np.float32)[:, :turns],
          "format_ok": np.array([[True, False]] * batch), "num_turns": np.array([len(r) for r in replies_per_episode]),
          "score": np.full(batch, 0.4, np.float32), "success": np.array([True] + [False] * (batch - 1))}


def test_device_env_episodes_decode_with_each_episodes_action_names(tokenizer):
  env, params = envs.make("bandit")  # arm names drawn per episode
  seeds = np.arange(6)
  states = jax.device_get(reset_batch(env, params, seeds))
  names = [env.episode_action_names(unbatch(states, i), params) for i in seeds]
  assert len({n for pair in names for n in pair}) > 2
  replies = [[f"hm</think><answer>{pair[1]}</answer>", "no answer here"] for pair in names]
  source = DeviceSource(model_config=None, env=env, env_params=params, assets=None, config=RolloutConfig(), mesh=None)
  records = decode_episodes(source, tokenizer, episodes_of(tokenizer, replies), seeds)
  for record, seed, pair, (reply, _) in zip(records, seeds, names, replies):
    assert record["seed"] == seed and record["system"] == SYSTEM and record["score"] == 0.4
    first, second = record["turns"]
    assert (first["prompt"], first["reply"], first["actions"]) == (PROMPTS[0], reply, [pair[1]])
    assert (first["reward"], first["format_ok"]) == (0.5, True)
    assert (second["prompt"], second["actions"], second["reward"], second["format_ok"]) == (PROMPTS[1], [], -0.1,
                                                                                           False)
  assert [r["success"] for r in records] == [True] + [False] * 5


def test_host_text_env_actions_are_the_answer_it_scores(tokenizer):
  source = TextSource(model=None, tokenizer=tokenizer, vocab=None, make_env=None, config=RolloutConfig())
  episodes = episodes_of(tokenizer, [["add</think><answer> 1 + 2 </answer>"]])
  (record,) = decode_episodes(source, tokenizer, episodes, [7])
  assert [turn["actions"] for turn in record["turns"]] == [["1 + 2"]]


def test_transcript_text_escapes_control_characters_and_can_be_compact():
  record = {"seed": 3, "score": -0.1, "success": False, "system": "S" * 50,
            "turns": [{"prompt": "first", "reply": "a\x1b[2Jb" + "x" * 100, "actions": [], "reward": -0.1,
                       "format_ok": False},
                      {"prompt": "second", "reply": "c", "actions": ["Up", "?"], "reward": 0.0, "format_ok": True}]}
  full = transcript_text(record)
  assert "\x1b" not in full and "a\\x1b[2Jb" in full and "S" * 50 in full and "second" in full
  assert "actions: none; reward -0.10; format penalty" in full and "actions: Up, ?; reward 0.00; format ok" in full
  compact = transcript_text(record, compact=True, max_chars=20)
  assert "S" * 20 not in compact and "first" in compact and "second" not in compact
  assert "[... 89 characters ...]" in compact  # the escaped reply has 109
