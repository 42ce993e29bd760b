"""What a run says when it starts: model, parameter count, devices and mesh; library log chatter turned down."""

from __future__ import annotations

import logging

import jax
from clu import parameter_overview

from ragen_jax import paths
from ragen_jax.models import bundled_model_dir, lora
from ragen_jax.models.scratch import SCRATCH_TINY, TINY_DIMS

QUIET_LOGGERS = ("absl", "orbax", "jax")  # Orbax logs each checkpoint step through absl (a few modules through
# their own loggers); jax names the backends it skips


def quiet_library_logs() -> None:
  """Orbax's (absl's) and JAX's INFO lines to WARNING; the root logger, and so this project's INFO lines, keep
  their level."""
  for name in QUIET_LOGGERS:
    logging.getLogger(name).setLevel(logging.WARNING)


def model_source(model_path: str) -> str:
  """The `model.path` a run loads, saying when it is the bundled model or the built-in tiny random one."""
  if model_path == SCRATCH_TINY:
    return (f"{SCRATCH_TINY}, a random model ({TINY_DIMS['num_layers']} layers, hidden {TINY_DIMS['hidden_size']}) "
            f"with the bundled SmolLM2 tokenizer")
  return model_path or f"the bundled SmolLM2-135M-Instruct ({bundled_model_dir()})"


def startup_lines(exp, parameter_table: str | None = None) -> list[str]:
  """Lines describing an `assembly.Experiment`: model and its size, devices, mesh (`parameter_table`: where the
  parameter table was written)."""
  model = exp.model.config
  count = parameter_overview.count_parameters(exp.model.params)
  devices = jax.devices()
  kinds = ", ".join(sorted({d.device_kind for d in devices} - {devices[0].platform}))
  mesh = " x ".join(f"{axis}={size}" for axis, size in exp.mesh.shape.items())
  return [f"model: {model_source(exp.config.model.path)}",
          f"  {model.model_type}, {model.num_layers} layers, hidden {model.hidden_size}, {model.num_heads} heads "
          f"({model.num_kv_heads} KV), vocab {model.vocab_size}; {count:,} parameters ({model.param_dtype}, "
          f"computing in {model.dtype}; remat {model.remat}, LM head "
          f"{f'in blocks of {model.logits_chunk} tokens' if model.logits_chunk else 'unchunked'})"
          + (f"; table in {parameter_table}" if parameter_table else ""),
          *_lora_lines(model, exp.model.params, count),
          f"devices: {len(devices)} {devices[0].platform}{f' ({kinds})' if kinds else ''} in {jax.process_count()} "
          f"process(es); mesh {mesh} over {exp.mesh.size} of them"]


def _lora_lines(model, params, count: int) -> list[str]:
  """A line on the LoRA adapters when the model has them (none otherwise)."""
  if model.lora is None:
    return []
  trained = parameter_overview.count_parameters(lora.split(model, params)[1])
  return [f"  LoRA rank {model.lora.rank} (alpha {model.lora.alpha:g}) on {', '.join(model.lora.targets)}: "
          f"{trained:,} trained parameters ({100 * trained / (count - trained):.2f}% of the frozen base, which is "
          f"also the KL reference)"]


def write_parameter_table(params, workdir: str) -> str:
  """Writes clu's parameter table (name, shape, dtype, size, sharding) to `workdir/parameters.txt`; returns it."""
  path = paths.join(workdir, "parameters.txt")
  paths.write_text(path, parameter_overview.get_parameter_overview(params, include_stats="sharding") + "\n")
  return path
