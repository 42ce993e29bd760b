"""On-device environments for multi-turn agent RL (pure JAX, gymnax style).

    env, params = envs.make("sokoban", dim_room=(7, 7))
    obs, state = env.reset(key, params)
    obs, state, reward, done, info = env.step(key, state, action, params)

Every function above is pure, jits and vmaps. Each env also renders its
observation straight to token ids (`env.render_tokens`) and answers are parsed
on device (`envs.text.parse_actions`); see `envs.text` and `envs.core`.
"""
import typing

from envs.bandit import Bandit
from envs.core import Environment
from envs.frozenlake import FrozenLake
from envs.lightsout import LightsOut
from envs.sokoban import Sokoban

REGISTRY: dict[str, type[Environment]] = {
  "sokoban": Sokoban,
  "frozenlake": FrozenLake,
  "bandit": Bandit,
  "lightsout": LightsOut,
}


def _new(name: str) -> Environment:
  if name not in REGISTRY:
    raise ValueError(f"unknown environment {name!r}; known: {sorted(REGISTRY)}")
  return REGISTRY[name]()


def make(name: str, **overrides):
  """(env, params) for a registered environment; overrides replace default params."""
  env = _new(name)
  return env, env.make_params(**overrides)


def param_types(name: str) -> dict[str, object]:
  """The type hint of every parameter of environment `name` (the names `make(name, **overrides)` takes)."""
  return typing.get_type_hints(type(_new(name).default_params()))
