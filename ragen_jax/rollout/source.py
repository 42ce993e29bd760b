"""Rollout sources: where the trainer, evaluation and the demo get their `Trajectories` from.

A source knows its training sequence length and plays one episode per seed,
`run(params, seeds_B, group_ids_B, key, split) -> Trajectories`, with the sampling
settings of `split` ("train" or "validation", see `RolloutConfig.for_split`), the
batch sharded over the mesh. `DeviceSource` plays pure-JAX environments in one jit
(`device.device_rollout`); `TextSource` plays host text environments (Countdown,
math, code) turn by turn (`text.text_rollout`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Protocol

import jax
import numpy as np

from envs.text import VocabTable
from ragen_jax import mesh as mesh_lib
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.model import Model, input_sharding, put_batch
from ragen_jax.rollout.device import device_rollout, slot_layout
from ragen_jax.rollout.episodes import RolloutAssets, RolloutConfig
from ragen_jax.rollout.text import text_rollout
from ragen_jax.trajectories import Trajectories


class RolloutSource(Protocol):
  """What consumes rollouts needs of them: the sequence length and `run`."""

  @property
  def seq_len(self) -> int: ...

  def run(self, params, seeds_B, group_ids_B, key, split: str = "train") -> Trajectories: ...


def _batch_put(mesh: jax.sharding.Mesh, array):
  return mesh_lib.put_global(array, input_sharding(mesh, np.shape(array)))


@dataclasses.dataclass(frozen=True)
class DeviceSource:
  """Episodes of a pure-JAX environment, every turn inside one jit."""

  model_config: ModelConfig
  env: object
  env_params: object
  assets: RolloutAssets
  config: RolloutConfig
  mesh: jax.sharding.Mesh

  @property
  def seq_len(self) -> int:
    return slot_layout(self.assets, self.config)[2]

  def run(self, params, seeds_B, group_ids_B, key, split: str = "train") -> Trajectories:
    with jax.set_mesh(self.mesh):
      return device_rollout(self.model_config, params, self.env, self.env_params, self.assets,
                            self.config.for_split(split), _batch_put(self.mesh, np.asarray(seeds_B, np.int32)),
                            _batch_put(self.mesh, np.asarray(group_ids_B, np.int32)), key)


@dataclasses.dataclass(frozen=True)
class TextSource:
  """Episodes of a host text environment: `make_env()` builds a fresh one per episode."""

  model: Model  # config and mesh; `run` plays with the params it is given
  tokenizer: object
  vocab: VocabTable  # the tokenizer's token table (`envs.text.Vocab(tokenizer).table`)
  make_env: Callable
  config: RolloutConfig

  @property
  def seq_len(self) -> int:
    return self.config.max_episode_len

  def run(self, params, seeds_B, group_ids_B, key, split: str = "train") -> Trajectories:
    """Each process plays the episodes its devices hold under the batch sharding (`mesh.process_rows`)."""
    model = dataclasses.replace(self.model, params=params)
    rows = mesh_lib.process_rows(model.mesh, len(seeds_B))
    traj = text_rollout(model, self.tokenizer, self.vocab, self.make_env, self.config.for_split(split),
                        np.asarray(seeds_B)[rows], np.asarray(group_ids_B)[rows], key, self.seq_len, split)
    return jax.tree.map(functools.partial(put_batch, model.mesh), traj)
