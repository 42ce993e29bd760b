"""Host-side text environments: answers checked in Python on the host.

    env = envs.host.make_text_env("countdown")          # or "math", "code", "search", "webshop"
    observation = env.reset(seed=10000, split="train")  # the seed picks the problem
    step = env.step("<think>...</think><answer>2 + 5 - 3</answer>")
    step.reward, step.done, step.success, step.format_ok, step.info

    steps = envs.host.score_batch(envs_list, responses)  # many episodes at once

Every env follows `TextEnv` (base.py). Countdown and math are one turn and
read their problems from tensorflow-datasets builders (datasets.py; generated
locally on first use, never downloaded). Code runs the model's program in a
sandbox (sandbox.py) against the problem's tests; `score_batch` overlaps many
such steps on a bounded pool. Search QA (search.py) plays several turns of
`search[query]` over a BM25 index or a retrieval server (retrieval.py), then
`finish[answer]`, scored by SQuAD F1. Web shopping (webshop.py) searches a product store, clicks through
results and options and buys, scored by WebShop's attribute, option and price match.
"""

import inspect
import typing

from envs.host.base import TextEnv, TextStep, extract_answer, score_batch
from envs.host.code_exec import CodeEnv
from envs.host.countdown import CountdownEnv
from envs.host.math_qa import MathEnv
from envs.host.search import SearchEnv
from envs.host.webshop import WebShopEnv

REGISTRY = {"countdown": CountdownEnv, "math": MathEnv, "code": CodeEnv, "search": SearchEnv, "webshop": WebShopEnv}


def make_text_env(name: str, **config) -> TextEnv:
  """A fresh env; `config` goes to the env's constructor (unknown keys raise TypeError)."""
  if name not in REGISTRY:
    raise ValueError(f"unknown text environment {name!r}; known: {sorted(REGISTRY)}")
  return REGISTRY[name](**config)


def option_types(name: str) -> dict[str, object]:
  """The type hint of every keyword `make_text_env(name, ...)` takes: the constructor's named arguments, then
  the fields of the dataclass its `**options` fill (the env's `OPTIONS`)."""
  cls = REGISTRY[name]
  hints = typing.get_type_hints(cls.__init__)
  types = {arg: hints[arg] for arg in inspect.signature(cls.__init__).parameters if arg in hints}
  # The dataclass's own fields, not its bases' (tfds' BuilderConfig has name, version, ...): a bare class with
  # just those annotations, resolved in the dataclass's module.
  own = type("Own", (), {"__annotations__": dict(vars(cls.OPTIONS)["__annotations__"]),
                         "__module__": cls.OPTIONS.__module__})
  return types | typing.get_type_hints(own)


__all__ = [
  "REGISTRY",
  "CodeEnv",
  "CountdownEnv",
  "MathEnv",
  "SearchEnv",
  "TextEnv",
  "TextStep",
  "WebShopEnv",
  "extract_answer",
  "make_text_env",
  "option_types",
  "score_batch",
]
