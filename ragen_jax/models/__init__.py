"""Llama / Qwen2 / Qwen3-family transformers: definition, HF and GGUF import/export, sharding."""

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.gguf_convert import bundled_model_dir
from ragen_jax.models.hf_io import CheckpointError, export_hf
from ragen_jax.models.model import (Model, abstract_params, forward_logits, init_params, load_pretrained,
                                    param_shardings)
from ragen_jax.models.transformer import KVCache, Transformer

__all__ = [
    "CheckpointError", "KVCache", "Model", "ModelConfig", "Transformer", "abstract_params",
    "bundled_model_dir", "export_hf", "forward_logits", "init_params", "load_pretrained", "param_shardings",
]
