"""Countdown and math envs over their tfds builders: data agrees with
reasoning-gym's own scorers, seeds pick problems deterministically, splits are
disjoint, user files load, and every response gets a reward."""

import json
import os
import sys

import pytest
from hypothesis import given, settings, strategies as st

import envs.host
from envs.host.countdown import countdown_reward, render
from ragen_jax.assembly import check_model_and_env
from ragen_jax.config import ConfigError, load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SMALL = dict(train_size=48, validation_size=16)
FUZZ = settings(max_examples=100, deadline=None, database=None)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


def _countdown(data_dir):
  return envs.host.make_text_env("countdown", data_dir=data_dir, **SMALL)


def _math(data_dir):
  return envs.host.make_text_env("math", data_dir=data_dir, **SMALL)


def test_builders_read_back_through_tfds_data_source_without_tensorflow(data_dir):
  env = _countdown(data_dir)
  assert (len(env.problems("train")), len(env.problems("validation"))) == (48, 16)
  math = _math(data_dir)
  assert len(math.problems("train")) == 48 and 0 < len(math.problems("validation")) <= 16
  assert "tensorflow" not in sys.modules


def test_countdown_data_agrees_with_reasoning_gym_scorer(data_dir):
  from reasoning_gym.games.countdown import CountdownConfig, CountdownDataset

  scorer = CountdownDataset(CountdownConfig(size=1, seed=0))
  env = _countdown(data_dir)
  for split in ("train", "validation"):
    for problem in env.problems(split):
      entry = {"metadata": {"numbers": problem["numbers"], "target": problem["target"]}}
      assert 3 <= len(problem["numbers"]) <= 4 and 1 <= problem["target"] <= 100
      assert scorer.score_answer(problem["solution"], entry) == 1.0
      assert countdown_reward(problem["solution"], problem["numbers"], problem["target"]) == 1.0
      plus = " + ".join(map(str, problem["numbers"]))
      peer_correct = scorer.score_answer(plus, entry) == 1.0
      assert countdown_reward(plus, problem["numbers"], problem["target"]) == (1.0 if peer_correct else 0.1)


def test_countdown_splits_are_disjoint_and_deterministic(data_dir, tmp_path):
  env = _countdown(data_dir)
  key = lambda p: (tuple(sorted(p["numbers"])), p["target"])  # noqa: E731
  train = {key(p) for p in env.problems("train")}
  assert not train & {key(p) for p in env.problems("validation")}
  fresh = envs.host.make_text_env("countdown", data_dir=str(tmp_path), **SMALL)  # rebuilt from scratch
  assert list(fresh.problems("train")) == list(env.problems("train"))


def test_seed_picks_the_problem(data_dir):
  env, other = _countdown(data_dir), _countdown(data_dir)
  table = env.problems("validation")
  for seed in (0, 5, 16, 123, 10_003):
    observation = env.reset(seed, split="validation")
    assert observation == other.reset(seed, split="validation")
    problem = table[seed % len(table)]
    assert observation == render(problem["numbers"], problem["target"])
    assert observation == f"Target: {problem['target']}, nums: {problem['numbers']}"


def test_countdown_episode(data_dir):
  env = _countdown(data_dir)
  env.reset(7)
  problem = env.problems()[7]
  miss = env.step("<think>no answer tag</think>")
  assert (miss.format_ok, miss.reward, miss.done) == (False, 0.0, False)
  assert miss.observation == render(problem["numbers"], problem["target"])
  assert not env.step(f"<think>easy</think> So: <answer>{problem['solution']}</answer>").format_ok
  hit = env.step(f"<think>easy</think><answer>{problem['solution']}</answer>")
  assert (hit.format_ok, hit.reward, hit.done, hit.success, hit.observation) == (True, 1.0, True, True, "")
  assert hit.info["target"] == problem["target"]
  with pytest.raises(RuntimeError, match="reset"):
    env.step("<answer>1</answer>")


def test_answer_grammar_without_think(data_dir):
  env = _countdown(data_dir)
  env.reset(7)
  solution = env.problems()[7]["solution"]
  reply = f"<think>{solution} works, so <answer>{solution}</answer>"  # no </think>
  assert not env.step(reply).format_ok
  [step] = envs.host.score_batch([env], [reply], enable_think=False)
  assert (step.format_ok, step.success) == (True, True)


def test_math_episode_and_gold_answers_agree_with_reasoning_gym(data_dir):
  import reasoning_gym

  env = _math(data_dir)
  gym = reasoning_gym.create_dataset("gsm_symbolic", size=64, seed=0)
  by_question = {gym[i]["question"]: gym[i] for i in range(64)}
  for seed in range(10):
    question = env.reset(seed)
    entry = by_question[question]
    gold = env._problem["answer"]
    assert gym.score_answer(gold, entry) == 1.0
    wrong = env.step(f"<think>hm</think><answer>{int(float(gold)) + 1}</answer>")
    assert (wrong.reward, wrong.success, wrong.done) == (0.0, False, True)
    env.reset(seed)
    right = env.step(f"<think>...</think><answer>The total is \\boxed{{{gold}}}.</answer>")
    assert (right.reward, right.success) == (1.0, True)


@pytest.mark.parametrize("layout", ["gsm8k_jsonl", "metamath_json_list"])
def test_math_from_a_user_file(tmp_path, data_dir, layout):
  path = tmp_path / "problems.jsonl"
  rows = [(f"What is {i} + {i}?", 2 * i) for i in range(40)]
  if layout == "gsm8k_jsonl":
    gsm8k = [{"question": q, "answer": f"{a // 2} + {a // 2} = {a}\n#### {a}"} for q, a in rows]
    path.write_text("\n".join(json.dumps(r) for r in gsm8k))
  else:
    path.write_text(json.dumps([{"query": q, "response": f"Add them. The answer is: {a}"} for q, a in rows]))
  env = envs.host.make_text_env("math", path=str(path), validation_fraction=0.25, data_dir=data_dir)
  train, validation = env.problems("train"), env.problems("validation")
  assert len(train) + len(validation) == 40 and len(validation) > 0
  assert not {p["question"] for p in train} & {p["question"] for p in validation}
  answers = dict(rows)
  assert all(p["answer"] == str(answers[p["question"]]) for p in list(train) + list(validation))
  question = env.reset(3)
  assert env.step(f"<think>add</think><answer>{answers[question]}</answer>").reward == 1.0


def test_math_file_with_separate_validation_file(tmp_path, data_dir):
  train_path, validation_path = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
  train_path.write_text(json.dumps({"problem": "1+1?", "solution": "\\boxed{2}"}) + "\n")
  validation_path.write_text(json.dumps({"problem": "2+2?", "solution": "\\boxed{4}"}) + "\n")
  env = envs.host.make_text_env("math", path=str(train_path), validation_path=str(validation_path), data_dir=data_dir)
  assert env.reset(0, "validation") == "2+2?" and env.problems("validation")[0]["answer"] == "4"


@pytest.mark.parametrize(
  "content, message",
  [
    ('{"question": "q"}\n', "needs one of the keys"),
    ('{"question": "q", "answer": ""}\n', "non-empty"),
    ('{"question": "q", "answer": "1"}\nnot json\n', ":2: not JSON"),
    ("[1, 2]", "JSON object"),
  ],
)
def test_bad_user_files_fail_early_and_clearly(tmp_path, data_dir, content, message):
  path = tmp_path / "bad.jsonl"
  path.write_text(content)
  with pytest.raises(ValueError, match=message):  # when the env is configured, before any reset
    envs.host.make_text_env("math", path=str(path), data_dir=data_dir)


def _check_math_config(data_dir, **params):
  """`assembly.check_model_and_env` of the tiny test config on the math env with `params`."""
  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.env.name, config.env.params = "math", {"data_dir": data_dir, **params}
  check_model_and_env(config)


def _write(path, lines, prefix=""):
  path.write_text(prefix + "\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
  return str(path)


PROBLEMS = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(40)]


def test_config_refuses_an_empty_validation_file(tmp_path, data_dir):
  validation_path = tmp_path / "val.jsonl"
  validation_path.write_text("\n\n")
  with pytest.raises(ConfigError, match=r"val.jsonl has no records$"):
    _check_math_config(data_dir, path=_write(tmp_path / "train.jsonl", PROBLEMS), validation_path=str(validation_path))


def test_config_refuses_a_file_that_lands_in_one_split(tmp_path, data_dir):
  with pytest.raises(ConfigError, match="all 40 records of .*train.jsonl land in the train split") as error:
    _check_math_config(data_dir, path=_write(tmp_path / "train.jsonl", PROBLEMS), validation_fraction=0.0)
  assert "\n" not in str(error.value)


def test_config_names_the_line_of_a_broken_record(tmp_path, data_dir):
  path = tmp_path / "broken.jsonl"
  path.write_text(json.dumps(PROBLEMS[0]) + '\n{"question": "q", "answer": \n')
  with pytest.raises(ConfigError, match=r"broken.jsonl:2: not JSON") as error:
    _check_math_config(data_dir, path=str(path))
  assert "\n" not in str(error.value)


def test_config_accepts_a_byte_order_mark(tmp_path, data_dir):
  path = _write(tmp_path / "bom.jsonl", PROBLEMS, prefix="\ufeff")
  _check_math_config(data_dir, path=path)
  list_path = tmp_path / "bom.json"
  list_path.write_text("\ufeff" + json.dumps(PROBLEMS), encoding="utf-8")
  _check_math_config(data_dir, path=str(list_path))
  env = envs.host.make_text_env("math", path=path, data_dir=data_dir)
  assert len(env.problems("train")) + len(env.problems("validation")) == 40


def test_config_accepts_numeric_answers_as_text(tmp_path, data_dir):
  path = _write(tmp_path / "numeric.jsonl", [{"question": f"Half of {2 * i}?", "answer": i} for i in range(39)]
                + [{"question": "Half of 1?", "answer": 0.5}])
  _check_math_config(data_dir, path=path)
  env = envs.host.make_text_env("math", path=path, data_dir=data_dir)
  answers = {p["question"]: p["answer"] for p in list(env.problems("train")) + list(env.problems("validation"))}
  assert answers["Half of 14?"] == "7" and answers["Half of 1?"] == "0.5"


def test_config_errors(data_dir):
  with pytest.raises(ValueError, match="unknown text environment"):
    envs.host.make_text_env("sokoban")
  with pytest.raises(ValueError, match="unknown CountdownConfig option"):
    envs.host.make_text_env("countdown", size=3)
  with pytest.raises(FileNotFoundError):
    envs.host.make_text_env("math", path="/nonexistent.jsonl")
  with pytest.raises(ValueError, match="split"):
    _countdown(data_dir).reset(0, split="test")


def test_instructions_and_turns():
  assert envs.host.CountdownEnv.instruction.startswith("You are solving the Countdown puzzle.")
  assert envs.host.MathEnv.instruction == "You are solving Math problems. "
  assert envs.host.CountdownEnv.max_turns == envs.host.MathEnv.max_turns == 1


@FUZZ
@given(response=st.text(max_size=300), seed=st.integers(0, 10**6), wrap=st.booleans())
def test_every_response_gets_a_reward(data_dir, response, seed, wrap):
  text = f"<think>x</think><answer>{response}</answer>" if wrap else response
  for env in (_countdown(data_dir), _math(data_dir)):
    env.reset(seed)
    step = env.step(text)
    assert step.reward in (0.0, 0.1, 1.0)
    assert step.format_ok == (envs.host.extract_answer(text) is not None)
    assert step.done == step.format_ok
