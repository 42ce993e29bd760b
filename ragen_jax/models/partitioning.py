"""Logical-axis partition rules for parameters and activations.

Every parameter is created with logical axis names (`nn.with_logical_partitioning`);
`LOGICAL_RULES` maps them onto the mesh axes of `ragen_jax.mesh` ("data", "fsdp",
"tensor"). Activations are constrained with `constrain`, a no-op outside a mesh.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec

LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("layers", None),
    ("norm", None),
    ("value", None),
    ("lora_rank", None),
    # activations
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("head_dim", None),
    ("act_kv_heads", "tensor"),
    ("cache_layers", None),
    ("cache_length", None),
    ("lookup_batch", "data"),  # the embedding lookup's rows (`Transformer._embed`)
    ("lookup_embed", "fsdp"),
)


def logical_to_spec(logical_axes) -> PartitionSpec:
  """PartitionSpec for a tuple of logical axis names under LOGICAL_RULES."""
  return nn.logical_to_mesh_axes(logical_axes, LOGICAL_RULES)


def constrain(x: jax.Array, logical_axes: tuple[str | None, ...]) -> jax.Array:
  """Sharding constraint on an activation inside jit under `jax.set_mesh`; no-op without a mesh.

  A dimension that its mesh axes do not divide (say 3 KV heads over tensor=2) is replicated.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = []
  for size, axes in zip(x.shape, logical_to_spec(logical_axes)):
    names = (axes,) if isinstance(axes, str) else (axes or ())
    shards = math.prod(mesh.shape[name] for name in names)
    spec.append(axes if size % shards == 0 else None)
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))


def param_specs(abstract_variables):
  """Mesh PartitionSpecs for a (boxed, abstract) variable tree made by `Transformer.init`."""
  return jax.tree.map(lambda spec: nn.logical_to_mesh_axes(spec, LOGICAL_RULES),
                      nn.get_partition_spec(abstract_variables), is_leaf=lambda s: isinstance(s, PartitionSpec))
