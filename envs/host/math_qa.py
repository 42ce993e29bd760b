"""Math word problems: one turn, reward 1 when the final answer matches.

Problems come from reasoning-gym's `gsm_symbolic` (default) or from a user's
JSON/JSONL file (`path=`, GSM8K / MetaMathQA layouts); see `envs.host.datasets`.
Matching is `math_answers.answers_match` (normalised exact match, numbers
compared numerically, `\\boxed{}` and trailing text handled).
"""

from __future__ import annotations

from envs.host import datasets
from envs.host.base import TextStep, check_split, extract_answer, format_failure, split_index
from envs.host.math_answers import answers_match

INSTRUCTION = "You are solving Math problems. "  # RAGEN's MetamathQA wording


class MathEnv:
  """One math episode; `reset(seed)` picks problem seed mod split size."""

  name = "math"
  instruction = INSTRUCTION
  max_turns = 1
  OPTIONS = datasets.GsmSymbolicConfig  # the fields `**generator` sets (without `path`)

  def __init__(
    self,
    path: str | None = None,
    validation_path: str = "",
    validation_fraction: float = 0.1,
    data_dir: str | None = None,
    **generator,
  ):
    """With `path`: that file. Otherwise gsm_symbolic with `generator` =
    `datasets.GsmSymbolicConfig` fields (train_size, validation_size, seed)."""
    if path is not None:
      if generator:
        raise ValueError(f"math from a file takes no generator options, got {sorted(generator)}")
      self._builder = datasets.RagenMathFile
      self._config = datasets.math_file_config(path, validation_path, validation_fraction)
    else:
      self._builder = datasets.RagenGsmSymbolic
      self._config = datasets.gsm_symbolic_config(**generator)
    self._data_dir = str(data_dir or datasets.default_data_dir())
    self._problem: dict | None = None
    self._done = False

  def problems(self, split: str = "train") -> datasets.Problems:
    return datasets.problems(self._builder, self._config, check_split(split), self._data_dir)

  def reset(self, seed: int, split: str = "train") -> str:
    table = self.problems(split)
    self._problem, self._done = table[split_index(seed, len(table))], False
    return self._problem["question"]

  def step(self, response: str, enable_think: bool = True) -> TextStep:
    if self._problem is None or self._done:
      raise RuntimeError("no episode running: call reset() first")
    gold = self._problem["answer"]
    answer = extract_answer(response, enable_think)
    if answer is None:
      return format_failure(self._problem["question"], {"target": gold})
    correct = answers_match(answer, gold)
    self._done = True
    return TextStep("", float(correct), True, correct, True, {"answer": answer, "target": gold})
