"""Model handles: config + params on a mesh, and the pure functions that apply them."""

from __future__ import annotations

import dataclasses
import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ragen_jax import mesh as mesh_lib
from ragen_jax.models import hf_io, lora
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.partitioning import param_specs as _boxed_param_specs
from ragen_jax.models.transformer import Transformer


def _init_variables(config: ModelConfig, with_value_head: bool, key):
  tokens = jnp.zeros((1, 1), jnp.int32)
  return Transformer(config, with_value_head).init(key, tokens, method="logits_and_values")


def abstract_params(config: ModelConfig, with_value_head: bool = False):
  """ShapeDtypeStruct tree of the (unboxed) params."""
  boxed = jax.eval_shape(functools.partial(_init_variables, config, with_value_head), jax.random.key(0))
  return nn.unbox(boxed)["params"]


def param_specs(config: ModelConfig, with_value_head: bool = False):
  """PartitionSpec tree matching `abstract_params`, from the logical partition rules."""
  boxed = jax.eval_shape(functools.partial(_init_variables, config, with_value_head), jax.random.key(0))
  return _boxed_param_specs(boxed)["params"]


def param_shardings(config: ModelConfig, mesh: Mesh, with_value_head: bool = False):
  """NamedSharding tree matching `abstract_params`, from the logical partition rules."""
  return jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(config, with_value_head),
                      is_leaf=lambda s: isinstance(s, PartitionSpec))


def init_params(config: ModelConfig, key, mesh: Mesh | None = None, with_value_head: bool = False):
  """Randomly initialised params, created directly in their shardings on `mesh`."""
  mesh = mesh or mesh_lib.single_device_mesh()
  shardings = param_shardings(config, mesh, with_value_head)
  init = jax.jit(lambda k: nn.unbox(_init_variables(config, with_value_head, k))["params"],
                 out_shardings=shardings)
  return init(key)


def adapter_params(config: ModelConfig, mesh: Mesh, path: str | os.PathLike = "", seed: int = 0) -> dict:
  """The LoRA adapters of `config` on `mesh`: read from the PEFT directory `path` (`lora.save_adapters`), or fresh
  (`b` = 0: the adapted model equals the base; `a` random from `seed`)."""
  abstract = lora.split(config, abstract_params(config))[1]
  shardings = lora.split(config, param_shardings(config, mesh))[1]
  if path:
    return lora.load_adapters(path, config, abstract, shardings)
  # only the adapters are outputs: the compiler drops the base weights' initialisation
  init = jax.jit(lambda k: lora.split(config, nn.unbox(_init_variables(config, False, k))["params"])[1],
                 out_shardings=shardings)
  return init(jax.random.key(seed))


@functools.partial(jax.jit, static_argnames=("config",))
def forward_logits(config: ModelConfig, params, tokens_BT, valid_BT=None):
  """float32 logits [B, T, V] of a full (left- or right-padded) batch, no cache."""
  module = Transformer(config)
  hidden, _ = module.apply({"params": params}, tokens_BT, valid_BT)
  return module.apply({"params": params}, hidden, method="lm_logits")


def input_sharding(mesh: Mesh, shape) -> NamedSharding:
  """Batch-sharded over data × fsdp when the batch divides, else replicated."""
  if shape[0] % mesh_lib.batch_shards(mesh) == 0:
    return mesh_lib.batch_sharding(mesh, len(shape))
  return NamedSharding(mesh, PartitionSpec())


def put_batch(mesh: Mesh, rows) -> jax.Array:
  """A batch placed as `input_sharding` places it, from the rows of it that this process holds
  (`mesh.process_rows`: all of them with one process; with several the batch must divide over the batch shards)."""
  rows = np.asarray(rows)
  if jax.process_count() == 1:
    return jax.device_put(rows, input_sharding(mesh, rows.shape))
  return jax.make_array_from_process_local_data(mesh_lib.batch_sharding(mesh, rows.ndim), rows)


@dataclasses.dataclass(frozen=True)
class Model:
  """A model handle: its config, its params placed on `mesh`, and convenience calls."""

  config: ModelConfig
  params: dict
  mesh: Mesh

  def logits(self, tokens, valid=None) -> jax.Array:
    """float32 logits [B, T, vocab] for int tokens [B, T]."""
    tokens = np.asarray(tokens, np.int32)
    with jax.set_mesh(self.mesh):
      sharding = input_sharding(self.mesh, tokens.shape)
      tokens = jax.device_put(tokens, sharding)
      valid = None if valid is None else jax.device_put(np.asarray(valid, bool), sharding)
      return forward_logits(self.config, self.params, tokens, valid)

  def export(self, out_dir, tokenizer=None):
    """Writes a transformers-loadable HF directory (LoRA adapters merged into the weights they adapt)."""
    return hf_io.export_hf(lora.merge(self.config, self.params), lora.without(self.config), out_dir, tokenizer)


def _resolve_dtypes(dtype: str, param_dtype: str | None) -> dict:
  return {"dtype": dtype, "param_dtype": param_dtype or dtype}


def load_pretrained(path: str | os.PathLike, mesh: Mesh | None = None, dtype: str = "float32",
                    param_dtype: str | None = None, adapters: str | os.PathLike = "", **computation) -> Model:
  """Loads a local HF Llama/Qwen2/Qwen3 directory onto `mesh` (default: one device).

  `dtype` is the compute dtype; `param_dtype` defaults to it. `computation`: other `ModelConfig` fields that
  config.json does not hold (remat, logits_chunk, lora). With `lora`, the model carries adapters: those of the PEFT
  directory `adapters`, or fresh ones (`adapter_params`).
  """
  config = ModelConfig.from_hf(hf_io.read_hf_config(path), **_resolve_dtypes(dtype, param_dtype), **computation)
  mesh = mesh or mesh_lib.single_device_mesh()
  base = lora.without(config)
  params = hf_io.load_params(path, base, abstract_params(base), param_shardings(base, mesh))
  if config.lora is not None:
    params = lora.combine(params, adapter_params(config, mesh, adapters))
  return Model(config=config, params=params, mesh=mesh)
