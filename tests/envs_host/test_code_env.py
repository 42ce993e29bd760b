"""The code env: bundled problems, users' JSONL, multi-turn retries and batched scoring."""

import json
import os

import pytest

import envs.host
from envs.host import score_batch
from envs.host import sandbox
from envs.host.code_exec import load_code_problems
from ragen_jax.assembly import check_model_and_env
from ragen_jax.config import ConfigError, load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _code_env(**params):
  """The code env with the default isolation, or the basic opt-in where namespaces are unavailable (where the
  default refuses to build)."""
  if sandbox.available_isolation() != "namespaces":
    params.setdefault("isolation", "basic")
  return envs.host.make_text_env("code", **params)


def _answer(code: str) -> str:
  return f"<think>plan</think><answer>\n```python\n{code}```\n</answer>"


def test_bundled_problems_reference_solutions_pass_in_one_batch():
  problems = load_code_problems()
  assert (len(problems["train"]), len(problems["validation"])) == (19, 5)
  batch, responses = [], []
  for split, table in problems.items():
    for seed in range(len(table)):
      env = _code_env()
      env.reset(seed, split)
      batch.append(env)
      responses.append(_answer(table[seed].solution))
  steps = score_batch(batch, responses)
  assert [s.reward for s in steps] == [1.0] * 24
  assert all(s.success and s.done and s.format_ok and s.info["tests_passed"] == s.info["tests_total"] for s in steps)
  assert [s.info["problem_id"] for s in steps] == [p.id for split in problems.values() for p in split]


def test_partial_credit_is_the_fraction_of_tests_passed():
  env = _code_env()
  problem = next(p for p in env.problems() if p.id == "fizzbuzz")
  env.reset(env.problems().index(problem))
  # Right for n <= 2 only: passes fizzbuzz(1) and fizzbuzz(0), fails the other two.
  step = env.step(_answer("def fizzbuzz(n):\n    return [str(i) for i in range(1, n + 1)]\n"))
  assert (step.reward, step.success, step.done) == (0.5, False, True)
  assert (step.info["tests_passed"], step.info["tests_total"]) == (2, 4)


def test_retries_with_feedback_earn_only_improvements():
  env = _code_env(max_turns=3)
  index = next(i for i, p in enumerate(env.problems()) if p.id == "gcd")
  assert "gcd(a, b)" in env.reset(index)
  missing = env.step("I think the answer is Euclid's algorithm.")
  assert (missing.format_ok, missing.reward, missing.done) == (False, 0.0, False)
  first = env.step(_answer("def gcd(a, b):\n    return 1\n"))  # passes gcd(17, 5) only
  assert (first.reward, first.done) == (0.25, False)
  assert first.observation.startswith("Passed 1 of 4 tests.")
  assert "gcd(12, 18) returned 1, expected 6" in first.observation
  worse = env.step(_answer("def gcd(a, b):\n    return 0\n"))  # passes gcd(0, 0) only
  assert (worse.reward, worse.done) == (0.0, False)
  solved = env.step(_answer("import math\ndef gcd(a, b):\n    return math.gcd(a, b)\n"))
  assert (solved.reward, solved.success, solved.done, solved.observation) == (0.75, True, True, "")
  assert first.reward + worse.reward + solved.reward == 1.0
  with pytest.raises(RuntimeError, match="reset"):
    env.step(_answer("def gcd(a, b):\n    return 1\n"))


def test_turn_limit_ends_the_episode():
  env = _code_env(max_turns=2)
  env.reset(0)
  assert not env.step(_answer("def digit_sum(n):\n    return 0\n")).done
  last = env.step(_answer("def digit_sum(n):\n    return 0\n"))
  assert last.done and not last.success and last.observation == ""


def test_user_jsonl_in_mbpp_and_stdio_layouts(tmp_path):
  path = tmp_path / "mine.jsonl"
  records = [
    {"text": "Write square(x).", "test_list": ["assert square(3) == 9", "assert square(-2) == 4"]},
    {"problem": "Print the input twice.", "tests": [{"input": "ab\n", "output": "ab\nab\n"}], "split": "validation"},
  ] + [{"problem": f"Return {i} from f().", "tests": [f"assert f() == {i}"]} for i in range(30)]
  path.write_text("\n".join(json.dumps(r) for r in records))
  env = _code_env(path=str(path), validation_fraction=0.2)
  train, validation = env.problems("train"), env.problems("validation")
  assert len(train) + len(validation) == 32 and "Print the input twice." in [p.problem for p in validation]
  square = next(i for i, p in enumerate(train) if p.problem == "Write square(x).")
  env.reset(square)
  assert env.step(_answer("def square(x):\n    return x * x\n")).reward == 1.0
  echo = next(i for i, p in enumerate(validation) if p.problem == "Print the input twice.")
  env.reset(echo, "validation")
  assert env.step(_answer("line = input()\nprint(line)\nprint(line)\n")).reward == 1.0


@pytest.mark.parametrize(
  "record, message",
  [
    ({"problem": "p"}, "needs one of the keys"),
    ({"problem": "p", "tests": []}, "non-empty list"),
    ({"problem": "p", "tests": ["assert ("]}, "not valid Python"),
    ({"problem": "p", "tests": ["assert 1"], "split": "test"}, "split must be"),
  ],
)
def test_bad_code_files_fail_early_naming_the_line(tmp_path, record, message):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps({"problem": "fine", "tests": ["assert 1"]}) + "\n" + json.dumps(record) + "\n")
  with pytest.raises(ValueError, match=message) as error:
    _code_env(path=str(path))
  assert "bad.jsonl:2" in str(error.value)


def test_score_batch_mixes_envs_and_keeps_order(tmp_path):
  code_env = _code_env(wall_seconds=3.0, cpu_seconds=1)
  code_env.reset(0)
  hanging = _code_env(wall_seconds=3.0, cpu_seconds=1)
  hanging.reset(1)
  countdown = envs.host.make_text_env("countdown", data_dir=str(tmp_path), train_size=8, validation_size=2)
  countdown.reset(0)
  steps = score_batch(
    [code_env, hanging, countdown],
    [_answer(code_env.problems()[0].solution), _answer("while True:\n    pass\n"), "no answer"],
  )
  assert [s.reward for s in steps] == [1.0, 0.0, 0.0]
  assert steps[1].info["status"] in ("timeout", "no_result") and steps[1].format_ok
  assert not steps[2].format_ok
  with pytest.raises(ValueError, match="twice"):
    score_batch([code_env, code_env], ["a", "b"])
  with pytest.raises(ValueError, match="responses"):
    score_batch([code_env], [])


def test_code_env_config_errors():
  with pytest.raises(ValueError, match="unknown code env option"):
    _code_env(timeout=3)
  with pytest.raises(ValueError, match="max_turns"):
    _code_env(max_turns=0)
  with pytest.raises(FileNotFoundError):
    _code_env(path="/nonexistent.jsonl")


def test_code_env_refuses_to_build_where_it_cannot_isolate(monkeypatch):
  monkeypatch.setattr(sandbox, "_startup_failure", lambda isolation: "not root" if isolation == "namespaces" else None)
  with pytest.raises(sandbox.SandboxUnavailable, match="isolation='basic'"):
    envs.host.make_text_env("code")
  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.env.name = "code"
  with pytest.raises(ConfigError, match="namespace isolation is unavailable here \\(not root\\)") as error:
    check_model_and_env(config)  # what training and evaluation call first, before loading anything
  assert "\n" not in str(error.value)
  config.env.params.isolation = "basic"  # the explicit opt-in
  check_model_and_env(config)
