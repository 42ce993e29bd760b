"""Mesh presets: chips and hosts of every TPU slice by the rule written out, meshes the trainer accepts."""

import jax
import pytest

from launch import commands, mesh_presets
from ragen_jax import config as config_lib
from ragen_jax import mesh as mesh_lib

# (JAX devices = chips, hosts) by hand: v4-N and v5p-N count TensorCores (2 per chip) on 4-chip hosts; v5e-N
# (v5litepod-N) and v6e-N count chips, N=8 on one 8-chip host, more on 4-chip hosts.
EXPECTED = {
    "v4-8": (4, 1), "v4-16": (8, 2), "v4-32": (16, 4), "v4-64": (32, 8),
    "v5p-8": (4, 1), "v5p-16": (8, 2), "v5p-32": (16, 4), "v5p-64": (32, 8), "v5p-128": (64, 16),
    "v5e-8": (8, 1), "v5e-16": (16, 4), "v5e-32": (32, 8), "v5e-64": (64, 16), "v5e-128": (128, 32),
    "v5e-256": (256, 64),
    "v6e-8": (8, 1), "v6e-16": (16, 4), "v6e-32": (32, 8), "v6e-64": (64, 16), "v6e-128": (128, 32),
    "v6e-256": (256, 64),
}
RUNTIMES = {"v4": "tpu-ubuntu2204-base", "v5p": "v2-alpha-tpuv5", "v5e": "v2-alpha-tpuv5-lite",
            "v6e": "v2-alpha-tpuv6e"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tpu_preset_chips_hosts_type_and_runtime(name):
  generation, _, size = name.partition("-")
  gcloud_name = f"v5litepod-{size}" if generation == "v5e" else name
  for preset in (mesh_presets.get_preset(name), mesh_presets.get_preset(gcloud_name)):
    assert (preset.devices, preset.hosts) == EXPECTED[name]
    assert preset.accelerator_type == gcloud_name
    assert preset.runtime_version == RUNTIMES[generation]
    assert preset.sizes() == (1, preset.devices, 1)  # every chip on fsdp


def test_every_preset_is_listed_above_or_local():
  tpu = {name.replace("v5litepod", "v5e") for name, p in mesh_presets.PRESETS.items() if p.accelerator_type}
  assert tpu == set(EXPECTED)
  assert {name for name, p in mesh_presets.PRESETS.items() if not p.accelerator_type} == {"cpu", "gpu1", "gpu8"}


@pytest.mark.parametrize("name, tensor", [(name, tensor) for name in sorted(mesh_presets.PRESETS)
                                          for tensor in (1, 2, 4) if mesh_presets.PRESETS[name].devices % tensor == 0])
def test_preset_meshes_fill_their_devices_exactly(name, tensor):
  preset = mesh_presets.PRESETS[name]
  sizes = preset.sizes(tensor)
  assert sizes == (1, preset.devices // tensor, tensor)
  assert mesh_lib.resolve_mesh_shape(sizes, preset.devices) == sizes
  with pytest.raises(ValueError):
    mesh_lib.resolve_mesh_shape(sizes, 2 * preset.devices)


def test_tensor_must_divide_the_devices():
  with pytest.raises(ValueError, match=r"--tensor=3 must divide the preset's 16 devices"):
    mesh_presets.mesh_settings("v5e-16", tensor=3)


def test_gpu8_builds_a_mesh_on_eight_devices():
  assert jax.device_count() == 8  # tests/conftest.py: 8 fake CPU devices
  mesh = mesh_lib.make_mesh(*mesh_presets.PRESETS["gpu8"].sizes(tensor=2))
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2}


def test_settings_parse_into_the_config_mesh():
  flags = commands.train_flags(str(commands.ROOT / "configs/tiny_test.py"), mesh_presets.mesh_settings("v5p-64", 2))
  config = config_lib.parse_config(["train", *flags])
  assert (config.mesh.data, config.mesh.fsdp, config.mesh.tensor) == (1, 16, 2)


def test_unknown_preset_lists_the_known_ones():
  message = "unknown mesh preset 'v9-1'; known: cpu, gpu1, gpu8, v4-8, v4-16,"
  with pytest.raises(KeyError, match=message):
    mesh_presets.get_preset("v9-1")
  assert mesh_presets.unknown_preset_message("v9-1").endswith("v6e-128, v6e-256")
