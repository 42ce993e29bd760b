"""Randomly initialised models for a given tokenizer (the CPU demo and tests start here), and `scratch:tiny`."""

from __future__ import annotations

import dataclasses
import os

import jax
from jax.sharding import Mesh

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.hf_io import export_hf
from ragen_jax.models.model import Model, init_params

SCRATCH_TINY = "scratch:tiny"  # the `model.path` of the built-in tiny random model; other tools rely on this spelling
TINY_DIMS = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def scratch_config(tokenizer, hidden_size: int = 128, num_layers: int = 2, num_heads: int = 4,
                   num_kv_heads: int = 2, intermediate_size: int | None = None, max_len: int = 4096,
                   tie_word_embeddings: bool = True) -> ModelConfig:
  """A Llama-family config sized to `tokenizer` (vocab rounded up to a multiple of 64)."""
  vocab = -(-len(tokenizer) // 64) * 64
  return ModelConfig(vocab_size=vocab, hidden_size=hidden_size, intermediate_size=intermediate_size or 3 * hidden_size,
                     num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     head_dim=hidden_size // num_heads, rope_theta=10000.0, rms_norm_eps=1e-5,
                     tie_word_embeddings=tie_word_embeddings, max_position_embeddings=max_len,
                     eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id)


def save_scratch_model(tokenizer, out_dir: str | os.PathLike, seed: int = 0, **dims) -> ModelConfig:
  """Writes a randomly initialised HF model directory (config, safetensors, tokenizer)."""
  config = scratch_config(tokenizer, **dims)
  export_hf(init_params(config, jax.random.key(seed)), config, out_dir, tokenizer)
  return config


def tiny_model(tokenizer, mesh: Mesh, seed: int = 0, **computation) -> Model:
  """The `scratch:tiny` model for `tokenizer`: 2 layers, hidden 64, random weights (seed 0), made on `mesh`;
  `computation`: `ModelConfig` fields such as dtype and remat."""
  config = dataclasses.replace(scratch_config(tokenizer, **TINY_DIMS), **computation)
  return Model(config=config, params=init_params(config, jax.random.key(seed), mesh), mesh=mesh)
