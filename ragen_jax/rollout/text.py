"""Rollouts of host-side text environments (Countdown, math, code) in the trajectory format.

Prompts follow the same layout as the device environments (SPEC §2), tokenised on
the host; the sampler re-prefills each history every turn and the environments
score the decoded replies (code candidates in parallel, see `envs.host.score_batch`).
"""

from __future__ import annotations

import jax
import numpy as np

from envs.host import score_batch
from envs.text import ANSWER_CLOSE
from ragen_jax.rollout import prompt
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.rollout.host import EpisodeRecord, assemble, context_windows
from ragen_jax.sampling import SamplingSession, stop_sequence_array
from ragen_jax.trajectories import Trajectories


def text_rollout(model, tokenizer, make_env, config: RolloutConfig, seeds_B, group_ids_B, key, seq_len: int,
                 split: str = "train") -> Trajectories:
  """Plays one episode per seed with fresh envs from `make_env()` and returns them packed."""
  pieces = prompt.ChatPieces.from_tokenizer(tokenizer)
  envs = [make_env() for _ in seeds_B]
  observations = [env.reset(int(seed), split) for env, seed in zip(envs, seeds_B)]
  system = prompt.system_text(envs[0].instruction)
  max_turns = min(config.max_turns, envs[0].max_turns)
  records = [EpisodeRecord() for _ in envs]
  done = np.zeros(len(envs), bool)
  success = np.zeros(len(envs), bool)
  rewards = np.zeros(len(envs), np.float32)
  stops = stop_sequence_array([tokenizer.encode(ANSWER_CLOSE, add_special_tokens=False)])
  think_close = tokenizer.encode(prompt.THINK_CLOSE, add_special_tokens=False)
  eos = set(model.config.eos_token_ids)
  turn_keys = jax.random.split(key, max_turns)
  ended_by_eos = np.zeros(len(envs), bool)
  system_ids = tokenizer.encode(pieces.system_open + system + pieces.system_to_user, add_special_tokens=False)
  for turn in range(max_turns):
    chunks = {}
    for i in np.flatnonzero(~done):
      text = "" if turn == 0 else ("" if ended_by_eos[i] else pieces.end_of_reply) + pieces.reply_to_user
      if turn:
        text += f"Reward:\n{prompt.format_reward(float(rewards[i]))}\n"
      text += prompt.user_text(turn, observations[i], max_turns - turn, config.max_new_tokens)
      chunks[i] = tokenizer.encode(text + pieces.generation_open + prompt.THINK_OPEN, add_special_tokens=False)
    chunk_tokens = [len(chunks.get(i, ())) for i in range(len(envs))]
    windows = context_windows(config, turn, records, chunk_tokens, len(system_ids))
    for i, ids in chunks.items():
      system_tokens = len(system_ids) if turn == 0 else 0
      records[i].add_prompt((system_ids if turn == 0 else []) + ids, turn, int(windows[i]), system_tokens)
    session = SamplingSession.for_replies(model, [r.tokens for r in records], config.max_new_tokens,
                                          [r.segment for r in records], [r.visible_from for r in records])
    gen = session.generate(config.max_new_tokens, config.rule, stop_sequences=stops, key=turn_keys[turn],
                           active=~done)
    tokens, lengths, logp = (np.asarray(x) for x in (gen.tokens_BN, gen.lengths_B, gen.model_logp_BN))
    active = np.flatnonzero(~done)
    replies = [tokenizer.decode([t for t in tokens[i, :lengths[i]] if t not in eos]) for i in active]
    steps = score_batch([envs[i] for i in active], [prompt.THINK_OPEN + r for r in replies])
    for i, step in zip(active, steps):
      ids = tokens[i, :lengths[i]].tolist()
      reward = step.reward + (0.0 if step.format_ok else config.format_penalty)
      reasoning = next((k for k in range(len(ids)) if ids[k:k + len(think_close)] == think_close), 0)
      records[i].add_reply(ids, logp[i, :lengths[i]].tolist(), turn, reward, step.format_ok, reasoning,
                           int(step.format_ok))
      rewards[i], success[i], observations[i] = reward, step.success, step.observation
      done[i] = step.done
    ended_by_eos = np.asarray(gen.ended_by_eos_B)
  return assemble(records, success, np.asarray(group_ids_B), seq_len, config.max_turns)
