"""Mesh sizes for common machines, as `--config.mesh.*=` overrides (stdlib only).

A preset fixes (data, fsdp, tensor) for the number of JAX devices a machine
has. On TPU that number is the chip count: v4 and v5p chips have two
TensorCores each but run as one "megacore" JAX device, v5e chips have one.
Sources (Cloud TPU docs, https://cloud.google.com/tpu/docs/):
  v4:  "Each TPU v4 chip contains two TensorCores" (tpu/docs/v4); the name
       counts TensorCores, so v4-8 = 4 chips, and a v4 host holds 4 chips.
  v5e: one TensorCore per chip (tpu/docs/v5e); gcloud calls it `v5litepod-N`
       with N = chips, so v5litepod-16 = 16 chips (4x4) on 4 hosts of 4 chips.
  v5p: topology table in tpu/docs/v5p: 2x4x4 = 64 cores = 32 chips = 8 hosts,
       so v5p-64 counts TensorCores and has 32 chips.
Sizing rule: every device on `fsdp` (parameters, optimizer state and the PPO
critic sharded as thinly as the slice allows), `tensor` 1 for models this small.
`python -m ragen_jax.plan` checked the paper setting at Qwen2.5-3B: PPO on a
v5e-16 peaks at 15.4 GiB per 16 GiB chip with fsdp=16 and 23.9 GiB with
data=2 x fsdp=8 (docs/scale_out.md has the table for other slices and sizes).
"""

from __future__ import annotations

import dataclasses
import math

MESH_AXES = ("data", "fsdp", "tensor")  # same order as ragen_jax.mesh.MESH_AXES


@dataclasses.dataclass(frozen=True)
class MeshPreset:
  """Mesh axis sizes for a machine; `devices` is the JAX device count it expects."""
  data: int
  fsdp: int
  tensor: int
  devices: int
  hosts: int = 1
  accelerator_type: str | None = None  # gcloud --accelerator-type, TPU presets only

  def __post_init__(self):
    if math.prod(self.sizes) != self.devices:
      raise ValueError(f"mesh {self.sizes} has {math.prod(self.sizes)} devices, expected {self.devices}")

  @property
  def sizes(self) -> tuple[int, int, int]:
    return (self.data, self.fsdp, self.tensor)


PRESETS: dict[str, MeshPreset] = {
    "cpu": MeshPreset(data=1, fsdp=1, tensor=1, devices=1),
    "gpu1": MeshPreset(data=1, fsdp=1, tensor=1, devices=1),
    "gpu8": MeshPreset(data=1, fsdp=8, tensor=1, devices=8),
    "v4-8": MeshPreset(data=1, fsdp=4, tensor=1, devices=4, hosts=1, accelerator_type="v4-8"),
    "v5e-16": MeshPreset(data=1, fsdp=16, tensor=1, devices=16, hosts=4, accelerator_type="v5litepod-16"),
    "v5p-64": MeshPreset(data=8, fsdp=4, tensor=1, devices=32, hosts=8, accelerator_type="v5p-64"),
}


def get_preset(name: str) -> MeshPreset:
  """The preset called `name`; a KeyError lists the known names."""
  if name not in PRESETS:
    raise KeyError(f"unknown mesh preset {name!r}; known: {', '.join(PRESETS)}")
  return PRESETS[name]


def mesh_settings(name: str) -> dict[str, str]:
  """Config keys and values of preset `name`: {"mesh.data": "2", ...}."""
  return {f"mesh.{axis}": str(size) for axis, size in zip(MESH_AXES, get_preset(name).sizes)}


def mesh_overrides(name: str) -> list[str]:
  """`--config.mesh.{data,fsdp,tensor}=N` flags for preset `name`."""
  return [f"--config.{key}={value}" for key, value in mesh_settings(name).items()]
