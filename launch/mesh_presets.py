"""Machines the launchers know: JAX devices, hosts, TPU slice type and runtime, and mesh sizes (stdlib only).

A preset fixes the JAX device count of a machine and its number of hosts (TPU VMs, one JAX process each).
Its mesh puts every device on `fsdp` (data=1, tensor=1): parameters, optimizer state and the PPO critic are
sharded as thinly as the slice allows. `sizes(tensor=N)` moves a factor N to `tensor` (fsdp = devices / N)
for models whose layers must be split within a host.

On TPU the device count is the chip count. Sources (Cloud TPU docs, https://cloud.google.com/tpu/docs/):
  v4:  "Each TPU v4 chip contains two TensorCores" (tpu/docs/v4). The name counts TensorCores and JAX sees a
       chip as one device ("megacore"), so v4-8 = 4 chips; a v4 host holds 4 chips.
  v5p: the same (tpu/docs/v5p: 2 TensorCores per chip, 4 chips per host), so v5p-64 = 32 chips on 8 hosts.
  v5e: one TensorCore per chip (tpu/docs/v5e); gcloud calls it `v5litepod-N` with N = chips. v5litepod-8 is
       one VM with 8 chips; larger slices are made of 4-chip VMs, so v5litepod-16 = 16 chips on 4 hosts.
  v6e: one TensorCore per chip (tpu/docs/v6e): "v6e slices are created using half-host VMs, each with 4 TPU
       chips", except v6e-8, one VM with all 8 chips; v6e-16 = 16 chips on 4 hosts.
Runtimes (`RUNTIME_VERSIONS`, gcloud --runtime-version), from "TPU software versions" (tpu/docs/runtimes):
v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 and older tpu-ubuntu2204-base.
`python -m ragen_jax.plan` checked the paper setting at Qwen2.5-3B: PPO on a v5e-16 peaks at 15.4 GiB per
16 GiB chip with fsdp=16 and 23.9 GiB with data=2 x fsdp=8 (docs/scale_out.md has the table for other slices).
"""

from __future__ import annotations

import dataclasses

MESH_AXES = ("data", "fsdp", "tensor")  # same order as ragen_jax.mesh.MESH_AXES

# gcloud --runtime-version per TPU generation, as gcloud spells the generation in --accelerator-type.
RUNTIME_VERSIONS = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}


@dataclasses.dataclass(frozen=True)
class MeshPreset:
  """A machine: `devices` JAX devices over `hosts` processes; TPU slices also name their gcloud type."""
  devices: int
  hosts: int = 1
  accelerator_type: str | None = None  # gcloud --accelerator-type, TPU presets only

  @property
  def runtime_version(self) -> str | None:
    """gcloud --runtime-version for the slice (TPU presets only)."""
    return RUNTIME_VERSIONS[self.accelerator_type.partition("-")[0]] if self.accelerator_type else None

  def sizes(self, tensor: int = 1) -> tuple[int, int, int]:
    """(data, fsdp, tensor): `tensor`-way tensor parallelism, every other factor of the devices on fsdp."""
    if tensor < 1 or self.devices % tensor:
      raise ValueError(f"--tensor={tensor} must divide the preset's {self.devices} devices")
    return (1, self.devices // tensor, tensor)


@dataclasses.dataclass(frozen=True)
class TpuFamily:
  """How a slice name `NAME-N` of one TPU generation maps to chips and hosts."""
  names: tuple[str, ...]  # preset name prefixes; the first is gcloud's
  sizes: tuple[int, ...]  # the N of the presets
  cores_per_chip: int  # what N counts per chip: 2 TensorCores on v4 and v5p, 1 (chips) on v5e and v6e
  chips_per_host: int  # in a multi-host slice
  single_host_chips: int  # the largest slice on one VM

  def preset(self, size: int) -> MeshPreset:
    chips = size // self.cores_per_chip
    hosts = 1 if chips <= self.single_host_chips else chips // self.chips_per_host
    return MeshPreset(devices=chips, hosts=hosts, accelerator_type=f"{self.names[0]}-{size}")


TPU_FAMILIES = (
    TpuFamily(names=("v4",), sizes=(8, 16, 32, 64), cores_per_chip=2, chips_per_host=4, single_host_chips=4),
    TpuFamily(names=("v5p",), sizes=(8, 16, 32, 64, 128), cores_per_chip=2, chips_per_host=4, single_host_chips=4),
    TpuFamily(names=("v5litepod", "v5e"), sizes=(8, 16, 32, 64, 128, 256), cores_per_chip=1, chips_per_host=4,
              single_host_chips=8),
    TpuFamily(names=("v6e",), sizes=(8, 16, 32, 64, 128, 256), cores_per_chip=1, chips_per_host=4,
              single_host_chips=8),
)

PRESETS: dict[str, MeshPreset] = {
    "cpu": MeshPreset(devices=1),
    "gpu1": MeshPreset(devices=1),
    "gpu8": MeshPreset(devices=8),
    **{f"{name}-{size}": family.preset(size) for family in TPU_FAMILIES for name in family.names
       for size in family.sizes},
}


def get_preset(name: str) -> MeshPreset:
  """The preset called `name`; a KeyError lists the known names."""
  if name not in PRESETS:
    raise KeyError(unknown_preset_message(name))
  return PRESETS[name]


def unknown_preset_message(name: str) -> str:
  return f"unknown mesh preset {name!r}; known: {', '.join(PRESETS)}"


def mesh_settings(name: str, tensor: int = 1) -> dict[str, str]:
  """Config keys and values of preset `name` with `tensor`-way tensor parallelism: {"mesh.data": "1", ...}."""
  return {f"mesh.{axis}": str(size) for axis, size in zip(MESH_AXES, get_preset(name).sizes(tensor))}
