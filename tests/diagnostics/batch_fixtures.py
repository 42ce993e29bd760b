"""Hand-built `Trajectories` for diagnostics tests, laid out as the rollout packs them.

An episode is its first prompt, then per turn a reply (`reasoning` `</think>` `answer`,
or a reply without `</think>`) and, before every later turn, an observation; every
prompt ends with `<think>`. `Episode.turn_texts` gives each turn's (prompt, reasoning)
straight from the lists, independent of the packed layout.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ragen_jax.trajectories import Trajectories

THINK, CLOSE = 2, 3


@dataclasses.dataclass
class Turn:
  reasoning: list[int]
  answer: list[int]
  closed: bool = True  # the reply closes its <think> block

  @property
  def reply(self) -> list[int]:
    return self.reasoning + [CLOSE] + self.answer if self.closed else self.reasoning + self.answer


@dataclasses.dataclass
class Episode:
  group: int
  prompt: list[int]
  turns: list[Turn]
  observations: list[list[int]] = dataclasses.field(default_factory=list)  # one per later turn
  score: float = 0.0

  def turn_texts(self) -> list[tuple[list[int], list[int]]]:
    """(prompt X incl. <think>, reasoning Z or [] without </think>) per turn."""
    out, context = [], self.prompt + [THINK]
    for k, turn in enumerate(self.turns):
      out.append((list(context), turn.reasoning if turn.closed else []))
      context += turn.reply
      if k + 1 < len(self.turns):
        context += self.observations[k] + [THINK]
    return out


def make_batch(episodes: list[Episode], seq_len: int, max_turns: int) -> Trajectories:
  """Packs episodes into a `Trajectories` batch (right padding)."""
  b = len(episodes)
  arrays = dict(tokens=np.zeros((b, seq_len), np.int32), valid=np.zeros((b, seq_len), bool),
                loss_mask=np.zeros((b, seq_len), bool), turn_of_token=np.full((b, seq_len), -1, np.int32),
                turn_end=np.zeros((b, seq_len), bool), token_rewards=np.zeros((b, seq_len), np.float32),
                score_rewards=np.zeros((b, seq_len), np.float32))
  per_turn = dict(response_start=np.full((b, max_turns), -1, np.int32), response_len=np.zeros((b, max_turns), np.int32),
                  reasoning_len=np.zeros((b, max_turns), np.int32))
  for i, episode in enumerate(episodes):
    tokens, generated, turn_ids = [], [], []

    def put(ids, turn, is_reply):
      tokens.extend(ids)
      generated.extend([is_reply] * len(ids))
      turn_ids.extend([turn] * len(ids))

    put(episode.prompt + [THINK], 0, False)
    for k, turn in enumerate(episode.turns):
      per_turn["response_start"][i, k] = len(tokens)
      per_turn["response_len"][i, k] = len(turn.reply)
      per_turn["reasoning_len"][i, k] = len(turn.reasoning) if turn.closed else 0
      put(turn.reply, k, True)
      arrays["turn_end"][i, len(tokens) - 1] = True
      if k + 1 < len(episode.turns):
        put(episode.observations[k] + [THINK], k + 1, False)
    if len(tokens) > seq_len:
      raise ValueError(f"episode {i} has {len(tokens)} tokens > seq_len {seq_len}")
    n = len(tokens)
    arrays["tokens"][i, :n], arrays["valid"][i, :n] = tokens, True
    arrays["loss_mask"][i, :n], arrays["turn_of_token"][i, :n] = generated, turn_ids
    arrays["score_rewards"][i, np.flatnonzero(generated)[-1]] = episode.score
  num_turns = np.asarray([len(e.turns) for e in episodes], np.int32)
  return Trajectories(
      **{k: jnp.asarray(v) for k, v in arrays.items()}, sample_logp=jnp.zeros((b, seq_len), jnp.float32),
      **{k: jnp.asarray(v) for k, v in per_turn.items()},
      turn_rewards=jnp.zeros((b, max_turns), jnp.float32), format_ok=jnp.ones((b, max_turns), bool),
      segment_ids=jnp.zeros((b, seq_len), jnp.int32), visible_from=jnp.zeros((b, seq_len), jnp.int32),
      score=jnp.asarray([e.score for e in episodes], jnp.float32), success=jnp.zeros((b,), bool),
      num_turns=jnp.asarray(num_turns), num_actions=jnp.asarray(num_turns),
      group_ids=jnp.asarray([e.group for e in episodes], jnp.int32))


def random_episodes(rng: np.random.Generator, num_groups: int, group_size: int, max_turns: int, vocab: int,
                    prompt_len=(4, 9), reasoning_len=(0, 7), answer_len=(1, 3), obs_len=(2, 5),
                    open_share: float = 0.15, min_turns: int = 1) -> list[Episode]:
  """Groups share their first prompt; turn counts (min_turns..max_turns), replies and
  observations vary per episode; lengths are drawn uniformly from the (low, high) ranges.

  Token ids are drawn from [4, vocab); about `open_share` of replies never close `<think>`.
  """
  draw = lambda bounds: rng.integers(4, vocab, size=rng.integers(bounds[0], bounds[1] + 1)).tolist()  # noqa: E731
  episodes = []
  for g in range(num_groups):
    prompt = draw(prompt_len)
    for _ in range(group_size):
      turns = [Turn(draw(reasoning_len), draw(answer_len), closed=rng.random() > open_share)
               for _ in range(rng.integers(min_turns, max_turns + 1))]
      episodes.append(Episode(g, prompt, turns, [draw(obs_len) for _ in turns[1:]], score=float(rng.normal())))
  return episodes
