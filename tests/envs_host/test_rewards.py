"""Reward rules: hand-written cases, peers (Python's own arithmetic, RAGEN's
countdown rule, reasoning-gym's scorer) and fuzzed malformed output."""

import re
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings, strategies as st
from math_verify import parse, verify

from envs.host.arithmetic import evaluate, parse_arithmetic
from envs.host.base import extract_answer
from envs.host.code_exec import extract_code
from envs.host.countdown import countdown_reward
from envs.host.math_answers import answers_match, gold_answer, last_boxed

FUZZ = settings(max_examples=300, deadline=None, database=None)


# --------------------------------------------------------------------------- answer block


@pytest.mark.parametrize(
  "response, enable_think, answer",
  [  # the turn's text, the prompt's <think> included; expected answers from RAGEN's rules
    ("<think>hm</think><answer> 2 + 3 </answer>", True, "2 + 3"),
    ("<think>hm</think>\n<answer>a</answer><answer>b</answer>", True, "a"),
    ("<think>hm</think><answer>\nmulti\nline\n</answer>", True, "multi\nline"),
    ("<think>hm</think><answer><answer>x</answer>", True, "x"),  # stray tags are removed
    ("<think>hm</think><answer>x<think>y</think><|im_end|>\u00a0</answer>", True, "xy"),
    ("<think>I could write <answer>1</answer> but no</think><answer>2</answer>", True, "2"),
    ("<think>go</think> So: <answer>7</answer>", True, None),  # text between </think> and <answer>
    ("<think>go <answer>7</answer>", True, None),  # no </think>
    ("<answer>a</answer>", True, None),
    ("<think>hm</think><answer></answer>", True, None),
    ("<think>hm</think><answer>\u00a0 </answer>", True, None),
    ("<think>hm</think><answer>no close", True, None),
    ("<think>hm</think></answer><answer>", True, None),
    ("no tags at all", True, None),
    ("<answer>a</answer><answer>b</answer>", False, "a"),
    ("<think>go</think> So: <answer>7</answer>", False, "7"),
    ("<think>go <answer><answer>7</answer>", False, "7"),
    ("<answer>no close", False, None),
  ],
)
def test_extract_answer(response, enable_think, answer):
  assert extract_answer(response, enable_think) == answer


def test_extract_code_takes_first_fenced_block_inside_the_answer():
  code = "```python\ndef f():\n    return 1\n```\ntext"
  assert extract_code(f"<think>p</think><answer>{code}</answer>") == "def f():\n    return 1\n"
  assert extract_code(f"<answer>{code}</answer>", enable_think=False) == "def f():\n    return 1\n"
  assert extract_code(f"<answer>{code}</answer>") is None  # no think block
  assert extract_code("<think>p</think><answer>def f(): return 1</answer>") == "def f(): return 1"
  assert extract_code("<think>p</think>```python\ndef f(): pass\n```") is None  # no answer block
  assert extract_code("<think>p</think><answer>```python\n```</answer>") is None


# --------------------------------------------------------------------------- arithmetic


def _expressions():
  """Random well-formed integer arithmetic, rendered with explicit parentheses."""
  leaves = st.integers(0, 60).map(str)
  return st.recursive(
    leaves,
    lambda inner: st.one_of(
      st.tuples(inner, st.sampled_from("+-*/"), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
      inner.map(lambda e: f"-{e}"),
    ),
    max_leaves=7,
  )


@FUZZ
@given(_expressions())
def test_evaluator_matches_python_arithmetic(text):
  # Peer: CPython evaluating the same (test-generated, trusted) text; ints stay exact.
  expression = parse_arithmetic(text)
  assert expression is not None
  assert list(expression.numbers) == [int(n) for n in re.findall(r"\d+", text)]
  try:
    expected = eval(text.replace("/", "*Fraction(1)/"), {"Fraction": Fraction, "__builtins__": {}})  # noqa: S307
  except ZeroDivisionError:
    expected = None
  assert evaluate(expression) == expected


@pytest.mark.parametrize(
  "text",
  [
    "2 ** 3",
    "2 // 3",
    "2 % 3",
    "abs(2)",
    "x + 1",
    "1.5 + 2",
    "True + 1",
    "'1' + '2'",
    "[1][0]",
    "1 if 1 else 2",
    "__import__('os').system('true')",
    "(lambda: 1)()",
    "1; 2",
    "1 = 1",
    "2 + 5 - 3 = 4",
    "",
    "((((1",
    "1e3",
    "0x2",
    "0X2",
    "0o5",
    "0b10",
    "1_0",
    "1E3",
    "\u0663",  # a non-ASCII digit
    "(" * 300 + "1" + ")" * 300,
    "1" * 600,
  ],
)
def test_parser_refuses_anything_but_integer_arithmetic(text):
  assert parse_arithmetic(text) is None


def test_evaluator_is_exact():
  assert evaluate(parse_arithmetic("7 / 3 * 3")) == 7
  assert evaluate(parse_arithmetic("1 / (3 - 3)")) is None
  assert evaluate(parse_arithmetic("-(2 - 5) * +4")) == 12


# --------------------------------------------------------------------------- countdown


@pytest.mark.parametrize(
  "answer, numbers, target, reward",
  [
    ("2 + 5 - 3", [3, 5, 2], 4, 1.0),
    ("(5 - 3) * 2", [3, 5, 2], 4, 1.0),
    ("5 * 2 - 3", [3, 5, 2], 4, 0.1),  # the right numbers, the wrong value
    ("5 / (3 - 3) + 2", [3, 5, 3, 2], 4, 0.1),  # division by zero: valid numbers, no value
    ("2 + 2", [3, 5, 2], 4, 0.0),  # wrong numbers
    ("2 + 5 - 3 + 0", [3, 5, 2], 4, 0.0),  # an extra number
    ("5 - 3", [3, 5, 2], 2, 0.0),  # a number unused
    ("2 + 5 - 3 = 4", [3, 5, 2], 4, 0.0),  # not an expression
    ("2 5 3", [3, 5, 2], 4, 0.0),  # RAGEN's digit regex would give 0.1
    ("12 / 3 + 3", [3, 3, 12], 7, 1.0),  # repeated numbers
    ("12 / 3 + 12", [3, 3, 12], 16, 0.0),
    ("-3 + 5 + 2", [3, 5, 2], 4, 1.0),
    ("0x2+0x5-0x3", [3, 5, 2], 4, 0.0),  # decimal integer literals only
    ("0b10+0o5-3", [3, 5, 2], 4, 0.0),
    ("1_0 / 5 + 2", [10, 5, 2], 4, 0.0),
    ("2e0 + 5 - 3", [3, 5, 2], 4, 0.0),
  ],
)
def test_countdown_reward_cases(answer, numbers, target, reward):
  assert countdown_reward(answer, numbers, target) == reward


def _ragen_countdown_reward(answer, numbers, target):
  """RAGEN's CountdownEnv.compute_reward (digit regex + eval), the reference rule."""
  if sorted(int(n) for n in re.findall(r"\d+", answer)) != sorted(numbers):
    return 0.0
  try:
    correct = abs(eval(answer, {"__builtins__": None}, {}) - target) < 1e-5  # noqa: S307 - test-generated text
  except ZeroDivisionError:
    correct = False
  return 1.0 if correct else 0.1


@FUZZ
@given(_expressions(), st.integers(-50, 200), st.booleans())
def test_countdown_reward_agrees_with_ragen_on_well_formed_answers(text, target, use_own_value):
  numbers = [int(n) for n in re.findall(r"\d+", text)]
  value = evaluate(parse_arithmetic(text))
  if use_own_value and value is not None and value.denominator == 1:
    target = int(value)
  # Known difference: RAGEN accepts floats within 1e-5 of the target, we compare exactly.
  assume(value is None or value == target or abs(value - target) > Fraction(1, 10**4))
  assert countdown_reward(text, numbers, target) == _ragen_countdown_reward(text, numbers, target)


@FUZZ
@given(st.text(max_size=300), st.lists(st.integers(1, 100), min_size=1, max_size=6), st.integers(1, 1000))
def test_countdown_reward_never_raises_on_arbitrary_text(text, numbers, target):
  assert countdown_reward(text, numbers, target) in (0.0, 0.1, 1.0)


# --------------------------------------------------------------------------- math


@pytest.mark.parametrize(
  "predicted, gold",
  [
    ("72", "72"),
    ("72.0", "72"),
    ("\\boxed{72}", "72"),
    ("The answer is \\boxed{72}.", "72"),
    ("$72", "72"),
    ("72 apples.", "72"),
    ("so she has 72", "72"),
    ("x = 72", "72"),
    ("seventy-two, i.e. 72", "72"),  # a hyphen inside a word is no minus
    ("5 + 67 = 72", "72"),
    ("1,234", "1234"),
    ("1234", "1,234"),
    ("-3", "-3"),
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac{1}{2}", "1/2"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("(1, 2)", "(1,2)"),
    ("\\text{(B)}", "(b)"),
    ("\\left( 3, 4 \\right)", "(3,4)"),
  ],
)
def test_math_answers_that_match(predicted, gold):
  assert answers_match(predicted, gold)


@pytest.mark.parametrize(
  "predicted, gold",
  [
    ("71", "72"),
    ("720", "72"),
    ("7.2", "72"),
    ("", "72"),
    ("seventy-two", "72"),
    ("72 or 73", "73"),  # two values
    ("72 or 73", "72"),
    ("72, 73", "72"),
    ("72e3", "72"),
    ("72E0", "72"),
    ("72!", "72"),
    ("72^2", "72"),
    ("72 * 1", "72"),
    ("- 72", "72"),
    ("so-72", "72"),
    ("\u221272", "72"),
    ("\\sqrt{72}", "72"),
    ("x > 72", "72"),
    ("1e309", "1"),
    ("so she has 3 bags of 72", "72"),
    ("\\boxed{71} but maybe 72", "72"),  # the box wins
    ("-72", "72"),
    ("(1, 3)", "(1,2)"),
    ("1/0", "5"),
    ("", ""),
  ],
)
def test_math_answers_that_do_not_match(predicted, gold):
  assert not answers_match(predicted, gold)


# Shared with math-verify (`verify(parse(gold), parse(predicted))`), the well-kept peer: answers both judge right,
# answers both judge wrong, and answers math-verify accepts but ours rejects, each with the reason.
MATH_BOTH_RIGHT = [
  ("72", "72"),
  ("72.0", "72"),
  ("72.00", "72"),
  ("$72$", "72"),
  ("\\boxed{72}", "72"),
  ("The answer is \\boxed{72}.", "72"),
  ("72 apples.", "72"),
  ("so she has 72", "72"),
  ("x = 72", "72"),
  ("1,234", "1234"),
  ("0.5", "1/2"),
  ("\\frac{1}{2}", "0.5"),
  ("-3", "-3"),
]
MATH_BOTH_WRONG = [("71", "72"), ("720", "72"), ("-72", "72"), ("72 or 73", "72"), ("72^2", "72"), ("$72!$", "72")]
MATH_STRICTER_THAN_MATH_VERIFY = [
  ("72e3", "72"),  # math-verify reads the leading 72 of 72000
  ("72!", "72"),  # outside $...$ it reads the 72 and drops the factorial
  ("- 72", "72"),  # it drops a spaced unary minus: the answer is -72
  ("1e309", "1"),  # it reads the leading 1 of an overflowing float
]


@pytest.mark.parametrize("predicted, gold", MATH_BOTH_RIGHT)
def test_math_answers_right_for_both_checkers(predicted, gold):
  assert answers_match(predicted, gold)
  assert verify(parse(gold), parse(predicted))


@pytest.mark.parametrize("predicted, gold", MATH_BOTH_WRONG)
def test_math_answers_wrong_for_both_checkers(predicted, gold):
  assert not answers_match(predicted, gold)
  assert not verify(parse(gold), parse(predicted))


@pytest.mark.parametrize("predicted, gold", MATH_STRICTER_THAN_MATH_VERIFY)
def test_math_answers_only_math_verify_accepts(predicted, gold):
  assert not answers_match(predicted, gold)
  assert verify(parse(gold), parse(predicted))  # if math-verify gets strict here, move the case to MATH_BOTH_WRONG


@pytest.mark.parametrize(
  "solution, gold",
  [
    ("She has 3 + 4 = 7 apples.\n#### 7", "7"),  # GSM8K
    ("... so 18 in total. The answer is: 18", "18"),  # MetaMathQA
    ("We get $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("42", "42"),
  ],
)
def test_gold_answer_layouts(solution, gold):
  assert gold_answer(solution) == gold


def test_last_boxed_balances_braces():
  assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
  assert last_boxed("\\boxed{unclosed") is None


@FUZZ
@given(
  st.integers(-(10**9), 10**9), st.sampled_from(["{}", "\\boxed{{{}}}", "{} dollars", "x = {}", "${}", "It is {}."])
)
def test_math_numbers_in_any_wrapping_match(value, template):
  assert answers_match(template.format(value), str(value))
  assert answers_match(template.format(f"{value:,}"), str(value))
  assert not answers_match(template.format(value + 1), str(value))


@FUZZ
@given(st.text(max_size=400), st.one_of(st.text(max_size=40), st.integers().map(str)))
def test_math_match_never_raises_on_arbitrary_text(predicted, gold):
  assert answers_match(predicted, gold) in (True, False)


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("\\boxed{}frac0123456789.,/-= $")), max_size=300))
def test_math_match_survives_adversarial_latex(predicted):
  assert answers_match(predicted, "12") in (True, False)
  assert answers_match(predicted, "\\frac{1}{2}") in (True, False)
