"""Defaults of every training run: RAGEN-2's main settings (SPEC §2, §4, §6).

Other configs start from `get_config()` here and change what they need. The sections
model, rollout, train, algorithm, filter, diagnostics and early_stop are declared, defaulted and
validated by their dataclasses, next to the code that uses them.
"""

import dataclasses

import ml_collections

from ragen_jax.assembly import ModelSettings
from ragen_jax.diagnostics.collapse import CollapseConfig
from ragen_jax.rl.early_stop import EarlyStopConfig
from ragen_jax.rl.presets import AlgorithmConfig
from ragen_jax.rl.snr_filter import FilterConfig
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.trainer import TrainConfig


def section(config_class) -> ml_collections.ConfigDict:
  """A config section holding the defaults of its dataclass."""
  return ml_collections.ConfigDict(dataclasses.asdict(config_class()))


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.workdir = "runs/base"

  c.model = section(ModelSettings)  # path "" = the bundled SmolLM2-135M-Instruct

  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1, "num_devices": -1})
  # multi-process (ragen_jax.distributed): "", 0 and -1 mean "from RAGEN_COORDINATOR, RAGEN_NUM_PROCESSES and
  # RAGEN_PROCESS_ID", or with none of them set, detected by JAX (Cloud TPU, SLURM, Open MPI)
  c.distributed = ml_collections.ConfigDict({"enabled": False, "coordinator": "", "num_processes": 0,
                                             "process_id": -1})

  c.env = ml_collections.ConfigDict()
  c.env.name = "sokoban"
  c.env.params = ml_collections.ConfigDict()  # overrides of the env's default params

  c.rollout = section(RolloutConfig)
  c.train = section(TrainConfig)
  c.algorithm = section(AlgorithmConfig)
  c.filter = section(FilterConfig)
  c.diagnostics = section(CollapseConfig)
  c.early_stop = section(EarlyStopConfig)

  c.evaluate = ml_collections.ConfigDict({"envs": "sokoban", "k": 1})  # ragen_jax.evaluate

  c.logging = ml_collections.ConfigDict()
  c.logging.tensorboard = True
  c.logging.wandb = False
  c.logging.wandb_project = "ragen_jax"
  c.logging.progress_bar = True
  return c
