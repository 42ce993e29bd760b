"""Device meshes from config, and placing pytrees on them."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_mesh_shape(sizes: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Replaces one -1 in `sizes` by the rest of the devices; checks the product."""
  sizes = tuple(int(s) for s in sizes)
  if len(sizes) != len(MESH_AXES):
    raise ValueError(f"mesh needs {len(MESH_AXES)} sizes for {MESH_AXES}, got {sizes}")
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh sizes {sizes}: each must be positive, at most one may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if num_devices % known:
    raise ValueError(f"mesh sizes {sizes} do not divide the {num_devices} devices")
  sizes = tuple(num_devices // known if s == -1 else s for s in sizes)
  if math.prod(sizes) != num_devices:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {num_devices}")
  return sizes


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
  """A ("data", "fsdp", "tensor") mesh with Auto axes over `devices` (default: all)."""
  devices = jax.devices() if devices is None else list(devices)
  shape = resolve_mesh_shape((data, fsdp, tensor), len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def mesh_from_config(cfg) -> Mesh:
  """Mesh from a config block with `data`, `fsdp`, `tensor` sizes (and optionally
  `num_devices`: use the first N devices; -1 = all)."""
  count = cfg.get("num_devices", -1)
  return make_mesh(cfg.data, cfg.fsdp, cfg.tensor, devices=None if count == -1 else jax.devices()[:count])


def put_replicated_if_elsewhere(tree, mesh: Mesh):
  """Leaves not already on `mesh` (e.g. fresh optimizer counters) are replicated onto it."""
  def place(x):
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
      return x
    return jax.device_put(x, replicated(mesh))
  return jax.tree.map(place, tree)


def single_device_mesh() -> Mesh:
  return make_mesh(1, 1, 1, devices=jax.devices()[:1])


def batch_shards(mesh: Mesh) -> int:
  """How many ways a batch is split over the mesh (data x fsdp)."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def _batch_shards_in_context() -> int:
  """data x fsdp of the mesh in context (inside jit under `jax.set_mesh`); 0 without such a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not {"data", "fsdp"} <= set(mesh.axis_names):
    return 0
  return batch_shards(mesh)


def rows_per_step(micro: int, batch: int) -> int:
  """Rows that one step of a loop over micro-batches of `micro` rows computes, under the mesh in context: the
  least multiple of `micro` that the mesh's batch shards (data x fsdp) divide, when it divides `batch`; else
  `micro`. A step of fewer rows than shards cannot split over them, and XLA then computes it on every device over
  again: 2-row steps on 8 devices took 7x as long as 8-row ones (tiny_test's scoring)."""
  rows = math.lcm(micro, max(_batch_shards_in_context(), 1))
  return rows if batch % rows == 0 else micro


def split_rows(x: jax.Array, rows: int) -> jax.Array:
  """`x` [batch, ...] as [batch // rows, rows, ...], steps of consecutive rows; under a mesh whose batch shards
  divide `rows`, each step's rows are laid out over them, so every step splits over every device."""
  steps = x.reshape(-1, rows, *x.shape[1:])
  shards = _batch_shards_in_context()
  if not shards or rows % shards:
    return steps
  return jax.lax.with_sharding_constraint(steps, PartitionSpec(None, ("data", "fsdp"), *([None] * (x.ndim - 1))))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Shards the leading (batch) axis over data × fsdp, replicates the rest."""
  return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def put_global(array, sharding: NamedSharding) -> jax.Array:
  """A global array from a host array every process holds in full; each process places only its own shards."""
  array = np.asarray(array)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def process_rows(mesh: Mesh, batch: int) -> np.ndarray:
  """int[b]: the rows of a `batch` that this process's devices hold under `batch_sharding`, in order (all of them
  with one process); raises ValueError when the batch does not divide over the batch shards of several processes."""
  if jax.process_count() == 1:
    return np.arange(batch)
  if batch % batch_shards(mesh):
    raise ValueError(f"a batch of {batch} does not divide over the {batch_shards(mesh)} data x fsdp shards of the "
                     f"mesh (needed with {jax.process_count()} processes)")
  blocks = {index[0].indices(batch)[:2] for index in batch_sharding(mesh, 1).addressable_devices_indices_map(
      (batch,)).values()}
  return np.concatenate([np.arange(start, stop) for start, stop in sorted(blocks)])


def local_rows(x) -> np.ndarray:
  """Host copy of the rows of `x` (sharded over its leading axis only) that this process's devices hold, in order
  (`process_rows`; all of them with one process)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  blocks = {shard.index[0].indices(x.shape[0])[:2]: shard.data for shard in x.addressable_shards}
  return np.concatenate([np.asarray(blocks[k]) for k in sorted(blocks)])


def process_max(value: int) -> int:
  """The largest `value` of all processes (call it from every process)."""
  if jax.process_count() == 1:
    return int(value)
  return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def fetch(tree):
  """Host numpy copy of every leaf, gathering arrays sharded over other processes (call it from every process)."""
  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
  return jax.tree.map(get, tree)
