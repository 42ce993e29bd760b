"""The module layout: entry points are thin and never import one another."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINTS = {"ragen_jax.train": "ragen_jax/train.py", "ragen_jax.evaluate": "ragen_jax/evaluate.py",
                "ragen_jax.chat": "ragen_jax/chat.py", "ragen_jax.demo.__main__": "ragen_jax/demo/__main__.py",
                "ragen_jax.demo.compare": "ragen_jax/demo/compare.py", "ragen_jax.plan": "ragen_jax/plan.py",
                "ragen_jax.study.__main__": "ragen_jax/study/__main__.py"}


def _imported_modules(path):
  tree = ast.parse(open(os.path.join(ROOT, path)).read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield node.module
      yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_entry_point_imports_another():
  for name, path in ENTRY_POINTS.items():
    others = set(ENTRY_POINTS) - {name}
    assert not others & set(_imported_modules(path)), f"{name} imports another entry point"
