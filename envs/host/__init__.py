"""Host-side text environments: answers checked in Python on the host.

    env = envs.host.make_text_env("countdown")          # or "math", "code"
    observation = env.reset(seed=10000, split="train")  # the seed picks the problem
    step = env.step("<think>...</think><answer>2 + 5 - 3</answer>")
    step.reward, step.done, step.success, step.format_ok, step.info

    steps = envs.host.score_batch(envs_list, responses)  # many episodes at once

Every env follows `TextEnv` (base.py). Countdown and math are one turn and
read their problems from tensorflow-datasets builders (datasets.py; generated
locally on first use, never downloaded). Code runs the model's program in a
sandbox (sandbox.py) against the problem's tests; `score_batch` overlaps many
such steps on a bounded pool.
"""

from envs.host.base import TextEnv, TextStep, extract_answer, score_batch
from envs.host.code_exec import CodeEnv
from envs.host.countdown import CountdownEnv
from envs.host.math_qa import MathEnv

REGISTRY = {"countdown": CountdownEnv, "math": MathEnv, "code": CodeEnv}


def make_text_env(name: str, **config) -> TextEnv:
  """A fresh env; `config` goes to the env's constructor (unknown keys raise TypeError)."""
  if name not in REGISTRY:
    raise ValueError(f"unknown text environment {name!r}; known: {sorted(REGISTRY)}")
  return REGISTRY[name](**config)


__all__ = [
  "REGISTRY",
  "CodeEnv",
  "CountdownEnv",
  "MathEnv",
  "TextEnv",
  "TextStep",
  "extract_answer",
  "make_text_env",
  "score_batch",
]
