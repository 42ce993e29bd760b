"""Multi-process JAX: `jax.distributed.initialize` from the config's `distributed` block or the environment.

Every process runs the same program. The coordinator address, the process count and this process's index
come from `distributed.{coordinator,num_processes,process_id}`, else from RAGEN_COORDINATOR,
RAGEN_NUM_PROCESSES and RAGEN_PROCESS_ID; with none of them set, JAX detects the cluster itself (Cloud TPU,
SLURM, Open MPI). On CPU, JAX 0.10 runs cross-process collectives over gloo by default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax

from ragen_jax.config import ConfigError


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
  value = environ.get(name, "")
  if not value:
    return default
  try:
    return int(value)
  except ValueError:
    raise ConfigError(f"{name}={value!r} is not an integer") from None


def cluster_settings(cfg, environ: Mapping[str, str] = os.environ) -> tuple[str, int, int] | None:
  """(coordinator, num_processes, process_id) from `cfg` or the RAGEN_* variables; None: let JAX detect them."""
  coordinator = cfg.coordinator or environ.get("RAGEN_COORDINATOR", "")
  num_processes = cfg.num_processes if cfg.num_processes > 0 else _env_int(environ, "RAGEN_NUM_PROCESSES", 0)
  process_id = cfg.process_id if cfg.process_id >= 0 else _env_int(environ, "RAGEN_PROCESS_ID", -1)
  given = {"coordinator (RAGEN_COORDINATOR)": bool(coordinator),
           "num_processes (RAGEN_NUM_PROCESSES)": num_processes > 0,
           "process_id (RAGEN_PROCESS_ID)": process_id >= 0}
  if not any(given.values()):
    return None
  missing = [name for name, ok in given.items() if not ok]
  if missing:
    raise ConfigError(f"distributed: {', '.join(missing)} not set; give the coordinator, the process count and "
                      "the process id together, or none of them to let JAX detect a TPU pod, SLURM or Open MPI")
  host, _, port = coordinator.rpartition(":")
  if not host or not port.isdigit():
    raise ConfigError(f"distributed.coordinator {coordinator!r} must be HOST:PORT of process 0")
  if process_id >= num_processes:
    raise ConfigError(f"distributed.process_id {process_id} must be below num_processes {num_processes}")
  return coordinator, num_processes, process_id


def initialize(cfg) -> None:
  """Starts jax.distributed once when `cfg.enabled`; call it before anything uses a JAX device."""
  if not cfg.enabled or jax.distributed.is_initialized():
    return
  settings = cluster_settings(cfg)
  if settings is not None:
    jax.distributed.initialize(*settings)
    return
  try:
    jax.distributed.initialize()
  except ValueError as error:
    raise ConfigError(f"distributed.enabled=True but JAX found no cluster to join ({error}); set "
                      "distributed.coordinator, num_processes and process_id (or RAGEN_COORDINATOR, "
                      "RAGEN_NUM_PROCESSES and RAGEN_PROCESS_ID)") from error
