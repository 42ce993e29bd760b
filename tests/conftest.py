"""Test set-up: 8 fake CPU devices so sharded code is tested against 1 device."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
  """HF directory of the bundled SmolLM2, converted fresh into a session temp cache (never a stale one)."""
  from ragen_jax.models.gguf_convert import bundled_model_dir
  return bundled_model_dir(tmp_path_factory.mktemp("ragen_jax_cache"))
