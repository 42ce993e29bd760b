"""Rollouts of host-side text environments (Countdown, math, code) in the trajectory format.

Prompts follow the same layout as the device environments (SPEC §2), tokenised on
the host; the sampler re-prefills each history every turn and the environments
score the decoded replies (code candidates in parallel, see `envs.host.score_batch`).
"""

from __future__ import annotations

import jax
import numpy as np

from envs import text as env_text
from envs.host import score_batch
from ragen_jax import mesh as mesh_lib
from ragen_jax.rollout import prompt
from ragen_jax.rollout.episodes import RolloutConfig, reasoning_lengths
from ragen_jax.rollout.host import context_windows, next_offsets, reprefill
from ragen_jax.sampling import pad_batch, stop_sequence_array
from ragen_jax.trajectories import Trajectories, TrajectoryWriter


def text_rollout(model, tokenizer, vocab: env_text.VocabTable, make_env, config: RolloutConfig, seeds_B, group_ids_B,
                 key, seq_len: int, split: str = "train") -> Trajectories:
  """Plays one episode per seed with fresh envs from `make_env()` and returns them packed (`vocab`: the
  tokenizer's token table, `env_text.Vocab(tokenizer).table`, for the reasoning lengths).

  An episode gets at most `seq_len` tokens (`rollout.max_episode_len`): a reply that would pass it is cut
  there and not scored, and an episode whose next prompt (and one reply token) would not fit ends after its
  turn; either way that last turn gets the format penalty (once) and counts as invalid. Only a first prompt
  longer than `seq_len` is an error.

  With several processes each plays its own rows of the batch (`mesh.process_rows`), all of them call the sampler
  together and play the same number of turns; the trajectories are this process's rows."""
  pieces = prompt.ChatPieces.from_tokenizer(tokenizer)
  envs = [make_env() for _ in seeds_B]
  observations = [env.reset(int(seed), split) for env, seed in zip(envs, seeds_B)]
  system = prompt.system_text(envs[0].instruction)
  max_turns = min(config.max_turns, envs[0].max_turns)
  writer = TrajectoryWriter.empty(len(envs), seq_len, config.max_turns)
  done = np.zeros(len(envs), bool)
  success = np.zeros(len(envs), bool)
  rewards = np.zeros(len(envs), np.float32)
  stops = stop_sequence_array([tokenizer.encode(env_text.ANSWER_CLOSE, add_special_tokens=False)])
  eos = set(model.config.eos_token_ids)
  turn_keys = jax.random.split(key, max_turns)
  ended_by_eos = np.zeros(len(envs), bool)
  system_ids = tokenizer.encode(pieces.system_open + system + pieces.system_to_user, add_special_tokens=False)

  def prompt_chunk(i: int, turn: int) -> list[int]:
    text = "" if turn == 0 else ("" if ended_by_eos[i] else pieces.end_of_reply) + pieces.reply_to_user
    if turn:
      text += f"Reward:\n{prompt.format_reward(float(rewards[i]))}\n"
    text += prompt.user_text(turn, observations[i], max_turns - turn, config.max_new_tokens)
    return (system_ids if turn == 0 else []) + tokenizer.encode(text + pieces.generation_open + prompt.THINK_OPEN,
                                                                 add_special_tokens=False)

  chunks = [prompt_chunk(i, 0) for i in range(len(envs))]
  for turn in range(max_turns):
    if not mesh_lib.process_max(int(not done.all())):  # every process's episodes are done
      break
    system_tokens = len(system_ids) if turn == 0 else 0
    tokens_BT, valid_BT = pad_batch(chunks, side="right")
    windows = context_windows(config, turn, writer, valid_BT.sum(1) - system_tokens, len(system_ids))
    writer = writer.write_chunk(next_offsets(writer, valid_BT.sum(1) + ~done, seq_len), turn, tokens_BT, valid_BT,
                                prompt.chunk_segments(system_tokens, tokens_BT.shape[1], turn), windows)
    active = ~done
    gen = reprefill(model, config, writer, stops, turn_keys[turn], active)
    room = seq_len - np.asarray(writer.slots.valid).sum(1)
    tokens, lengths = np.asarray(gen.tokens_BN), np.minimum(np.asarray(gen.lengths_B), room)
    cut = active & (lengths < np.asarray(gen.lengths_B))  # replies past the budget: truncated, not scored
    scored = np.flatnonzero(active & ~cut)
    replies = [tokenizer.decode([t for t in tokens[i, :lengths[i]] if t not in eos]) for i in scored]
    steps = score_batch([envs[i] for i in scored], [prompt.THINK_OPEN + r for r in replies], config.enable_think)
    format_ok = np.zeros(len(envs), bool)
    rewards[cut], done[cut] = config.format_penalty, True
    for i, step in zip(scored, steps):
      rewards[i] = step.reward + (0.0 if step.format_ok else config.format_penalty)
      format_ok[i], success[i], observations[i], done[i] = step.format_ok, step.success, step.observation, step.done
    ended_by_eos = np.asarray(gen.ended_by_eos_B)
    chunks = [[] for _ in envs]
    for i in np.flatnonzero(~done) if turn + 1 < max_turns else ():
      chunks[i] = prompt_chunk(i, turn + 1)
      if len(chunks[i]) + 1 > room[i] - lengths[i]:  # no room for the next turn: the episode is cut here
        rewards[i] += config.format_penalty if format_ok[i] else 0.0
        chunks[i], done[i], format_ok[i] = [], True, False
    reasoning_B = reasoning_lengths(vocab, gen.tokens_BN, lengths, config.enable_think)
    writer = writer.write_reply(next_offsets(writer, np.where(active, lengths, 0), seq_len), turn, active,
                                gen.tokens_BN, lengths, gen.model_logp_BN, windows, rewards, format_ok,
                                reasoning_B, format_ok.astype(np.int32))
  return jax.device_get(writer.finish(success, group_ids_B))
