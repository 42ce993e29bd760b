"""A safe evaluator for the arithmetic a model writes (no `eval` of model text).

`parse_arithmetic` reads decimal integers, `+ - * /`, unary minus/plus and
parentheses with Python's precedence (via `ast.parse`, which only builds a
tree) and refuses everything else, including Python's other integer literals
(`0x2`, `0o5`, `0b10`, `1_0`) and exponents (`1e3`, a float anyway). `evaluate` computes exactly with
`Fraction`s, so 7/3*3 is 7 and division by zero gives None.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
import re
from fractions import Fraction

MAX_EXPRESSION_CHARS = 500
_ARITHMETIC_CHARS = re.compile(r"[0-9+\-*/()\s]*")  # what ast.parse may see: no letters, so no 0x / 0o / 0b / 1e3 / 1_0

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


@dataclasses.dataclass(frozen=True)
class Arithmetic:
  """A parsed expression: its tree and the integer literals it uses, in order."""

  tree: ast.expr
  numbers: tuple[int, ...]


def parse_arithmetic(text: str) -> Arithmetic | None:
  """The expression in `text`, or None if it is anything but integer arithmetic."""
  if len(text) > MAX_EXPRESSION_CHARS or _ARITHMETIC_CHARS.fullmatch(text) is None:
    return None
  try:
    tree = ast.parse(text.strip(), mode="eval").body
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  numbers: list[int] = []
  stack = [tree]
  while stack:
    node = stack.pop()
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
      stack += [node.right, node.left]
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
      stack.append(node.operand)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
      numbers.append(node.value)
    else:
      return None
  return Arithmetic(tree, tuple(numbers))


def evaluate(expression: Arithmetic) -> Fraction | None:
  """Exact value of a parsed expression; None on division by zero."""

  def value(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant):
      return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
      return _UNARY[type(node.op)](value(node.operand))
    return _BINARY[type(node.op)](value(node.left), value(node.right))

  try:
    return value(expression.tree)
  except (ZeroDivisionError, RecursionError):
    return None
