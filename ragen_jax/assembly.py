"""Assembly: a config turned into mesh, model, tokenizer, environment and rollout source.

Entry points (`train`, `evaluate`, the demo) build what they need here and never import one
another. `check_model_and_env` validates the `model` and `env` sections; `build_mesh` and
`build_experiment` then load and place everything (nothing is compiled yet).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import transformers

import envs
from envs import host as host_envs
from envs import text as env_text
from ragen_jax import distributed
from ragen_jax import mesh as mesh_lib
from ragen_jax.config import ConfigError, check_one_of
from ragen_jax.models import Model, bundled_model_dir, load_pretrained
from ragen_jax.models.config import DTYPES
from ragen_jax.rollout.episodes import RolloutConfig, build_assets
from ragen_jax.rollout.source import DeviceSource, RolloutSource, TextSource

ENV_NAMES = tuple(envs.REGISTRY) + tuple(host_envs.REGISTRY)


def check_model_and_env(config, env_name: str | None = None) -> None:
  """Validates the `model` section and the environment `env_name` (default `env.name`) with `env.params`."""
  check_one_of("model.dtype", config.model.dtype, DTYPES)
  check_one_of("model.param_dtype", config.model.param_dtype, DTYPES)
  _environment(config.env.name if env_name is None else env_name, config.env.params.to_dict())


def _environment(name: str, overrides: dict):
  """(env, env_params) of a pure-JAX environment, or (make_text_env, None) of a host text environment; an
  unknown name or bad params raise ConfigError."""
  check_one_of("env.name", name, ENV_NAMES)
  try:
    if name in host_envs.REGISTRY:
      host_envs.make_text_env(name, **overrides)
      return functools.partial(host_envs.make_text_env, name, **overrides), None
    return envs.make(name, **overrides)
  except (TypeError, ValueError, OSError) as error:  # a host env reads and checks its data files here
    raise ConfigError(f"env.params {overrides} do not fit env {name!r}: {error}") from error


@dataclasses.dataclass
class Experiment:
  """What a config builds before anything runs (every setting already validated)."""

  config: object
  mesh: jax.sharding.Mesh
  model: Model
  tokenizer: object
  source: RolloutSource


def build_mesh(config, batch_size: int | None = None) -> jax.sharding.Mesh:
  """The mesh of the `mesh` section; `batch_size` (the training batch) must divide over its batch shards.

  With `distributed.enabled`, first joins the other processes (jax.distributed); the mesh then spans all of them.
  """
  distributed.initialize(config.distributed)
  mesh = mesh_lib.mesh_from_config(config.mesh)
  shards = mesh_lib.batch_shards(mesh)
  if batch_size is not None and batch_size % shards:
    raise ConfigError(f"the batch of {batch_size} episodes does not divide over {shards} data x fsdp shards of the "
                      f"mesh")
  if jax.process_count() > 1 and mesh.size != jax.device_count():
    raise ConfigError(f"mesh.num_devices={config.mesh.num_devices}: with {jax.process_count()} processes the mesh "
                      f"must span all {jax.device_count()} devices (-1)")
  return mesh


def build_experiment(config, rollout: RolloutConfig, mesh: jax.sharding.Mesh,
                     env_name: str | None = None) -> Experiment:
  """Model, tokenizer and the rollout source of `env_name` (default `env.name`) on `mesh` (`build_mesh`);
  the settings were validated first (`check_model_and_env`)."""
  name = config.env.name if env_name is None else env_name
  if jax.process_count() > 1 and name in host_envs.REGISTRY:
    raise ConfigError(f"env {name!r} is a host text environment, whose rollout is not split over processes yet; "
                      f"run it as one process (any number of local devices)")
  path = config.model.path or str(bundled_model_dir())
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  model = load_pretrained(path, mesh=mesh, dtype=config.model.dtype, param_dtype=config.model.param_dtype)
  if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in model.config.eos_token_ids:
    model = dataclasses.replace(model, config=dataclasses.replace(
        model.config, eos_token_ids=model.config.eos_token_ids + (tokenizer.eos_token_id,)))
  env, env_params = _environment(name, config.env.params.to_dict())
  if name in host_envs.REGISTRY:
    source = TextSource(model=model, tokenizer=tokenizer, vocab=env_text.Vocab(tokenizer).table, make_env=env,
                        config=rollout)
  else:
    assets = build_assets(tokenizer, env, env_params, rollout, table_size=model.config.vocab_size)
    source = DeviceSource(model_config=model.config, env=env, env_params=env_params, assets=assets, config=rollout,
                          mesh=mesh)
  return Experiment(config=config, mesh=mesh, model=model, tokenizer=tokenizer, source=source)

