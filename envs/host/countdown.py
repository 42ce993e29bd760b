"""Countdown: one turn, one arithmetic expression that must reach the target.

Reward (SPEC §3, RAGEN's CountdownEnv): 1.0 when the expression uses exactly
the given numbers (each once) and equals the target; 0.1 when it uses exactly
the given numbers but has another value (or divides by zero); 0 otherwise.
RAGEN checks the numbers with a digit regex on the raw text and `eval`s it;
here the text must also parse as integer arithmetic (`envs.host.arithmetic`),
so "1 2 3" or "2 + 5 - 3 = 4" score 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.host import datasets
from envs.host.arithmetic import evaluate, parse_arithmetic
from envs.host.base import TextStep, check_split, extract_answer, format_failure, split_index

INSTRUCTION = (
  "You are solving the Countdown puzzle. You should use the num list to create an equation that equals the "
  "target. Example answer format: <think> To find an equation using [3, 5, 2] to get 4. Let's check 2 + 5 = 7, "
  "7 - 3 = 4. So the answer is 2 + 5 - 3 = 4. </think><answer>2 + 5 - 3</answer>"
)
CORRECT, VALID_NUMBERS = 1.0, 0.1


def countdown_reward(answer: str, numbers: Sequence[int], target: int) -> float:
  """1.0 / 0.1 / 0 for an answer expression (see module docstring)."""
  expression = parse_arithmetic(answer)
  if expression is None or sorted(expression.numbers) != sorted(numbers):
    return 0.0
  return CORRECT if evaluate(expression) == target else VALID_NUMBERS


def render(numbers: Sequence[int], target: int) -> str:
  """RAGEN's observation: "Target: 4, nums: [3, 5, 2]"."""
  return f"Target: {target}, nums: {list(numbers)}"


class CountdownEnv:
  """One Countdown episode; `reset(seed)` picks problem seed mod split size."""

  name = "countdown"
  instruction = INSTRUCTION
  max_turns = 1
  OPTIONS = datasets.CountdownConfig  # the fields `**generator` sets

  def __init__(self, data_dir: str | None = None, **generator):
    """`generator`: `datasets.CountdownConfig` fields (sizes, number/target ranges, seed)."""
    self._config = datasets.countdown_config(**generator)
    self._data_dir = str(data_dir or datasets.default_data_dir())
    self._problem: dict | None = None
    self._done = False

  def problems(self, split: str = "train") -> datasets.Problems:
    return datasets.problems(datasets.RagenCountdown, self._config, check_split(split), self._data_dir)

  def reset(self, seed: int, split: str = "train") -> str:
    table = self.problems(split)
    self._problem, self._done = table[split_index(seed, len(table))], False
    return render(self._problem["numbers"], self._problem["target"])

  def step(self, response: str, enable_think: bool = True) -> TextStep:
    if self._problem is None or self._done:
      raise RuntimeError("no episode running: call reset() first")
    numbers, target = self._problem["numbers"], self._problem["target"]
    info = {"target": target, "numbers": numbers}
    answer = extract_answer(response, enable_think)
    if answer is None:
      return format_failure(render(numbers, target), info)
    reward = countdown_reward(answer, numbers, target)
    self._done = True
    return TextStep("", reward, True, reward == CORRECT, True, {"answer": answer, **info})
