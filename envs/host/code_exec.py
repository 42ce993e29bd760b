"""Code execution: the model writes a Python program, the sandbox runs its tests.

Problems are JSONL records (one JSON object per line, or a JSON list):
  {"problem": str, "tests": [test, ...], "id"?: str, "split"?: "train"|"validation", "solution"?: str}
A test is an assert statement ("assert f(2) == 4", run after the program's
definitions) or {"input": str, "output": str} (the whole program run with that
stdin; its stdout must match). "prompt"/"question"/"text" are read as the
problem and "test_list" as the tests (MBPP's layout). Records without "split"
go to validation by a stable hash of the problem text (`validation_fraction`).
The bundled set (`data/code_problems.jsonl`, written for this project) has 24
problems, 5 of them for validation, each with a reference solution.

Reward: the fraction of tests passed, counted once per episode: with
`max_turns` > 1 the model sees the first failure and may retry, and each turn
earns only its improvement over the best earlier turn, so the episode return
is the best pass rate. Anything the program does wrong (hangs, crashes,
floods, refused operations) passes no tests.

Batches: `score_batch(envs, responses)` (envs.host.base) steps many code
episodes at once; their sandboxes share the bounded `SandboxPool`.

Isolation: the sandbox's (envs.host.sandbox). Building the env checks it, so
where namespaces are unavailable `CodeEnv()` raises `SandboxUnavailable` (a
ValueError: a training run stops at start with a one-line error) unless
`isolation="basic"` opts in to weaker containment.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

from envs.host.base import TextStep, check_split, extract_answer, format_failure, split_index
from envs.host.records import field, file_digest, in_validation, read_records
from envs.host.sandbox import SandboxLimits, SandboxPool, Test, compile_test, default_pool, resolve_isolation
from ragen_jax import paths

BUNDLED_PROBLEMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "code_problems.jsonl")
INSTRUCTION = (
  "You are solving Python programming problems. Write a complete Python program that solves the problem; it "
  "is run against hidden tests and may use only the standard library. Example answer format: <think> I need "
  "the sum of two numbers, so I return a + b. </think><answer>def add(a, b):\n    return a + b</answer>"
)
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class CodeProblem:
  id: str
  problem: str
  tests: tuple[Test, ...]
  solution: str | None = None


def extract_code(response: str, enable_think: bool = True) -> str | None:
  """The program in the answer block (the first ``` fenced block inside it, if any)."""
  answer = extract_answer(response, enable_think)
  if answer is None:
    return None
  fenced = _FENCE.search(answer)
  code = fenced.group(1) if fenced else answer
  return code if code.strip() else None


@functools.cache
def _load(path: str, digest: str, validation_fraction: float) -> dict[str, tuple[CodeProblem, ...]]:
  del digest  # part of the cache key only: a changed file is read again
  splits: dict[str, list[CodeProblem]] = {"train": [], "validation": []}
  for place, record in read_records(path):
    problem = field(record, ("problem", "prompt", "question", "text"), place)
    tests = field(record, ("tests", "test_list"), place)
    if not isinstance(problem, str) or not problem.strip():
      raise ValueError(f"{place}: the problem must be a non-empty string")
    if not isinstance(tests, list) or not tests:
      raise ValueError(f"{place}: tests must be a non-empty list")
    try:
      compiled = tuple(compile_test(t) for t in tests)
    except ValueError as error:
      raise ValueError(f"{place}: {error}") from error
    split = record.get("split") or ("validation" if in_validation(problem, validation_fraction) else "train")
    if split not in splits:
      raise ValueError(f"{place}: split must be 'train' or 'validation', got {split!r}")
    problem_id = str(record.get("id", place))
    splits[split].append(CodeProblem(problem_id, problem.strip(), compiled, record.get("solution")))
  return {name: tuple(items) for name, items in splits.items()}


def load_code_problems(
  path: str = BUNDLED_PROBLEMS, validation_fraction: float = 0.1
) -> dict[str, tuple[CodeProblem, ...]]:
  """{"train": problems, "validation": problems} from a JSONL/JSON file (cached per process)."""
  if not paths.exists(path) or paths.isdir(path):
    raise FileNotFoundError(f"code problem file not found: {path}")
  path = paths.join(path)
  return _load(path, file_digest(path), validation_fraction)


class CodeEnv:
  """One code episode: the problem statement, then `max_turns` tries at most."""

  name = "code"
  instruction = INSTRUCTION
  OPTIONS = SandboxLimits  # the fields `**limits` sets

  def __init__(
    self,
    path: str = BUNDLED_PROBLEMS,
    validation_fraction: float = 0.1,
    max_turns: int = 1,
    pool: SandboxPool | None = None,
    **limits,
  ):
    """`limits`: `SandboxLimits` fields (wall_seconds, cpu_seconds, memory_mb, isolation, ...). Raises
    SandboxUnavailable when that isolation cannot work here."""
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    self._problems = load_code_problems(path, validation_fraction)
    known = sorted(f.name for f in dataclasses.fields(SandboxLimits))
    unknown = sorted(set(limits) - set(known))
    if unknown:
      raise ValueError(f"unknown code env option(s) {unknown}; sandbox limits: {known}")
    self._limits = SandboxLimits(**limits)
    resolve_isolation(self._limits)  # here, not in the middle of a rollout
    self._pool = pool or default_pool()
    self.max_turns = max_turns
    self._problem: CodeProblem | None = None
    self._turn, self._best, self._done = 0, 0.0, False

  def problems(self, split: str = "train") -> tuple[CodeProblem, ...]:
    return self._problems[check_split(split)]

  def reset(self, seed: int, split: str = "train") -> str:
    table = self.problems(split)
    self._problem = table[split_index(seed, len(table))]
    self._turn, self._best, self._done = 0, 0.0, False
    return self._problem.problem

  def step(self, response: str, enable_think: bool = True) -> TextStep:
    if self._problem is None or self._done:
      raise RuntimeError("no episode running: call reset() first")
    total = len(self._problem.tests)
    code = extract_code(response, enable_think)
    if code is None:
      return format_failure(self._problem.problem, {"tests_passed": 0, "tests_total": total})
    result = self._pool.run(code, self._problem.tests, self._limits)
    self._turn += 1
    reward = max(0.0, result.fraction - self._best)
    self._best = max(self._best, result.fraction)
    passed = sum(result.passed)
    success = passed == total
    self._done = success or self._turn >= self.max_turns
    observation = (
      "" if self._done else (f"Passed {passed} of {total} tests. {result.feedback}\nFix the program and answer again.")
    )
    info = {
      "answer": code,
      "tests_passed": passed,
      "tests_total": total,
      "status": result.status,
      "feedback": result.feedback,
      "problem_id": self._problem.id,
    }
    return TextStep(observation, reward, self._done, success, True, info)
