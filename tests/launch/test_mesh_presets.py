"""Mesh presets: sizes multiply to the device count, the trainer's mesh code and flag parser accept them."""

import jax
import pytest
from absl import flags
from ml_collections import config_flags

from launch import commands, mesh_presets
from ragen_jax import mesh as mesh_lib


@pytest.mark.parametrize("name", sorted(mesh_presets.PRESETS))
def test_preset_fills_its_devices_exactly(name):
  preset = mesh_presets.PRESETS[name]
  assert preset.data * preset.fsdp * preset.tensor == preset.devices
  assert mesh_lib.resolve_mesh_shape(preset.sizes, preset.devices) == preset.sizes
  with pytest.raises(ValueError):
    mesh_lib.resolve_mesh_shape(preset.sizes, 2 * preset.devices)


@pytest.mark.parametrize("name, tensorcores_per_chip", [("v4-8", 2), ("v5p-64", 2), ("v5e-16", 1)])
def test_tpu_presets_count_chips_from_the_slice_name(name, tensorcores_per_chip):
  """v4-N and v5p-N count TensorCores (2 per chip, one JAX device per chip); v5litepod-N counts chips."""
  preset = mesh_presets.PRESETS[name]
  size_in_name = int(preset.accelerator_type.rpartition("-")[2])
  assert preset.devices == size_in_name // tensorcores_per_chip
  assert preset.devices % preset.hosts == 0 and preset.devices // preset.hosts == 4  # 4 chips per host


def test_gpu8_builds_a_mesh_on_eight_devices():
  assert jax.device_count() == 8  # tests/conftest.py: 8 fake CPU devices
  mesh = mesh_lib.make_mesh(*mesh_presets.PRESETS["gpu8"].sizes)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}


def test_overrides_parse_into_the_config_mesh():
  argv = ["train", f"--config={commands.ROOT / 'configs/chat.py'}", *mesh_presets.mesh_overrides("v5p-64")]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
  values(argv)
  assert (values.config.mesh.data, values.config.mesh.fsdp, values.config.mesh.tensor) == (8, 4, 1)


def test_bad_preset_and_unknown_name_fail_clearly():
  with pytest.raises(ValueError, match=r"mesh \(2, 2, 1\) has 4 devices, expected 8"):
    mesh_presets.MeshPreset(data=2, fsdp=2, tensor=1, devices=8)
  with pytest.raises(KeyError, match="unknown mesh preset 'v9-1'; known: cpu, gpu1, gpu8"):
    mesh_presets.mesh_overrides("v9-1")
