"""The host-side text environment interface and the answer-block extraction.

A `TextEnv` runs one episode at a time on the host: `reset(seed, split)` gives
the first observation text, `step(response, enable_think)` scores the assistant's whole turn (the
prompt's `<think>` and the reply) and returns a `TextStep`. The answer is the
content of the turn's answer block under the grammar of `envs.text` (with
`enable_think`, the block right after the reasoning's `</think>`), its tags
removed and stripped of whitespace. A response without a non-empty block is a
format failure: `format_ok=False`, reward 0 and the episode does not advance
(the rollout applies the format penalty).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from envs.text import answer_parts


@dataclasses.dataclass(frozen=True)
class TextStep:
  observation: str  # next user-turn text ("" when done)
  reward: float  # env reward for this turn (the rollout adds the format penalty)
  done: bool
  success: bool
  format_ok: bool  # False: no parsable <answer> block; reward 0, state unchanged
  info: dict  # e.g. {"answer": ..., "target": ..., "tests_passed": k, "tests_total": n}


class TextEnv(Protocol):
  """One episode at a time; cheap to construct (datasets are cached per process)."""

  name: str
  instruction: str  # env instruction for the system prompt (RAGEN's wording where it exists)
  max_turns: int

  def reset(self, seed: int, split: str = "train") -> str: ...

  def step(self, response: str, enable_think: bool = True) -> TextStep: ...


def extract_answer(response: str, enable_think: bool = True) -> str | None:
  """The answer of a turn's text (`envs.text.answer_parts`); None without a block or when it is blank."""
  parts = answer_parts(response, enable_think)
  return (parts[1] or None) if parts else None


def format_failure(observation: str, info: dict | None = None) -> TextStep:
  """The step for a response without an answer: nothing happens, reward 0."""
  return TextStep(observation, 0.0, False, False, False, {"answer": None, **(info or {})})


def split_index(seed: int, size: int) -> int:
  """The instance a seed picks: seed mod size (RAGEN's countdown rule)."""
  if size <= 0:
    raise ValueError("the split has no instances")
  return seed % size


def check_split(split: str) -> str:
  if split not in ("train", "validation"):
    raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
  return split


def score_batch(envs: Sequence[TextEnv], responses: Sequence[str], enable_think: bool = True,
                max_workers: int | None = None) -> list[TextStep]:
  """`env.step(response, enable_think)` for every pair, concurrently; steps in input order.

  Code environments spend their step waiting on a sandbox process, so their
  steps overlap on up to `max_workers` threads (default: CPU count); the
  sandbox pool still bounds how many processes run at once. Each env must
  appear once (a step mutates its episode).
  """
  if len(envs) != len(responses):
    raise ValueError(f"{len(envs)} envs but {len(responses)} responses")
  if len({id(env) for env in envs}) != len(envs):
    raise ValueError("an env appears twice in one batch; each episode steps once per call")
  workers = min(len(envs), max_workers or os.cpu_count() or 1)
  if workers <= 1:
    return [env.step(response, enable_think) for env, response in zip(envs, responses)]
  with ThreadPoolExecutor(workers) as executor:
    return list(executor.map(lambda pair: pair[0].step(pair[1], enable_think), zip(envs, responses)))
