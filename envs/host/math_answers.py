"""Normalised exact match for math answers.

`answers_match(predicted, gold)`:
1. Reduce each side to its final answer: the content of the last `\\boxed{}`
   (or `\\fbox{}`) if there is one, then the text after the last "=".
2. If the gold answer is a number (integer, decimal, "1,234", "a/b",
   `\\frac{a}{b}`, optionally signed), the prediction matches when it states
   exactly one number, within 1e-6 of it (exact rationals, so 1/3 matches
   0.3333333), with words around it ("72 apples.", "so she has 72") but no
   other digit, operator or LaTeX command: "72e3", "72!", "72^2", "- 72",
   "72 or 73", "\\sqrt{72}" and "1e309" (against 1) are wrong.
3. Otherwise both sides are compared as strings after removing whitespace,
   `$`, `\\left`/`\\right`, `\\!`, `\\text{...}` wrappers, a trailing period,
   mapping `\\dfrac`/`\\tfrac` to `\\frac`, and lower-casing.

`gold_answer(solution)` reads the gold answer from the common layouts: GSM8K
("... #### 72"), MetaMathQA ("... The answer is: 72"), a `\\boxed{}`, or a
bare answer.

Why not math-verify (`math_verify.verify`) alone: it extracts one value
from a free-form answer and is lenient about what surrounds it, so it accepts
"72e3", "72!", "- 72" and "1e309" (against 1) as the number they start or end
with. A reward must not pay for an answer that states another value, so this
checker is stricter; tests/envs_host/test_rewards.py holds both to a shared
table of cases, listing where they differ and why.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_ANSWER_CHARS = 2000  # longer answers are judged on their last 2000 characters
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d{1,60})(?:\.\d{1,60})?|[-+]?\.\d{1,60}"
_NUMBER_ONLY = re.compile(rf"\s*(?P<n>{_NUMBER})\s*(?:/\s*(?P<d>{_NUMBER})\s*)?")
_LEADING_NUMBER = re.compile(rf"(?P<n>{_NUMBER})(?:\s*/\s*(?P<d>{_NUMBER}))?")
_ANY_NUMBER = re.compile(rf"(?<![\w.])(?P<n>{_NUMBER})(?:\s*/\s*(?P<d>{_NUMBER}))?")
_NOT_ONE_VALUE = re.compile(r"[\d+\-*/^!<>=\u2212\u00d7\u00f7\u00b7\u2264\u2265]|\\[A-Za-z]")  # left beside the number
_WORD_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")  # "seventy-two": a hyphen between letters is no minus
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*)\}\s*\{\s*([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_BOX_OPENERS = ("\\boxed{", "\\fbox{")


def last_boxed(text: str) -> str | None:
  """Content of the last \\boxed{...} / \\fbox{...} (braces balanced), or None."""
  start = max(text.rfind(opener) + len(opener) if opener in text else -1 for opener in _BOX_OPENERS)
  if start < 0:
    return None
  depth = 1
  for i in range(start, len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if depth == 0:
      return text[start:i]
  return None


def final_answer(text: str) -> str:
  """The part of an answer that carries the value: last box, then after the last "="."""
  text = text[-MAX_ANSWER_CHARS:]
  boxed = last_boxed(text)
  if boxed is not None:
    text = boxed
  return text.rpartition("=")[2].strip()


def _clean(text: str) -> str:
  text = _TEXT.sub(r"\1", text)
  for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "$", "\\(", "\\)", "\\[", "\\]"):
    text = text.replace(token, "")
  return text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").strip()


def _to_fraction(numerator: str, denominator: str | None) -> Fraction | None:
  try:
    value = Fraction(numerator.replace(",", ""))
    if denominator is not None:
      value /= Fraction(denominator.replace(",", ""))
  except (ValueError, ZeroDivisionError):
    return None
  return value


def _frac_to_slash(text: str) -> str:
  return _FRAC.sub(r"\1/\2", text)


def parse_number(text: str) -> Fraction | None:
  """The value of a text that is exactly one number ("-1,234.5", "3/4", "\\frac{3}{4}")."""
  match = _NUMBER_ONLY.fullmatch(_frac_to_slash(_clean(text)))
  return None if match is None else _to_fraction(match["n"], match["d"])


def find_number(text: str) -> Fraction | None:
  """The one number a free-form answer states, among words only; None for anything else (module docstring)."""
  text = _frac_to_slash(_clean(text))
  match = _LEADING_NUMBER.match(text) or _ANY_NUMBER.search(text)
  if match is None or _NOT_ONE_VALUE.search(_WORD_HYPHEN.sub(" ", text[: match.start()] + " " + text[match.end() :])):
    return None
  return _to_fraction(match["n"], match["d"])


def normalise_text(text: str) -> str:
  return re.sub(r"\s+", "", _clean(text)).rstrip(".").lower()


def answers_match(predicted: str, gold: str) -> bool:
  """Normalised exact match (see module docstring)."""
  predicted, gold = final_answer(predicted), final_answer(gold)
  gold_value = parse_number(gold)
  if gold_value is not None:
    value = find_number(predicted)
    return value is not None and abs(value - gold_value) <= Fraction(1, 10**6)
  return normalise_text(predicted) == normalise_text(gold) != ""


def gold_answer(solution: str) -> str:
  """The final answer in a worked solution (GSM8K, MetaMathQA, boxed or bare)."""
  if "####" in solution:
    return solution.rpartition("####")[2].strip()
  marker = re.search(r"The answer is:?", solution)
  if marker is not None:
    return solution[marker.end() :].strip()
  boxed = last_boxed(solution)
  return boxed.strip() if boxed is not None else solution.strip()
