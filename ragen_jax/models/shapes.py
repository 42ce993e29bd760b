"""Built-in model shapes: the config.json values of public checkpoints, for planning without weights.

`SHAPES[name]` holds the fields of that checkpoint's Hugging Face config.json that `ModelConfig.from_hf` reads
(nothing is downloaded; no weights exist). `shape_config(name)` is the `ModelConfig`. tests/models/test_shapes.py
checks every parameter count against the one its model card states.
"""

from __future__ import annotations

from ragen_jax.models.config import ModelConfig


def _qwen2(hidden, intermediate, layers, heads, kv_heads, tied, vocab=151936):
  return {"model_type": "qwen2", "hidden_size": hidden, "intermediate_size": intermediate,
          "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
          "vocab_size": vocab, "tie_word_embeddings": tied, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
          "max_position_embeddings": 32768}


def _qwen3(hidden, intermediate, layers, heads, kv_heads, tied):
  return {"model_type": "qwen3", "hidden_size": hidden, "intermediate_size": intermediate,
          "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
          "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": tied, "rope_theta": 1000000.0,
          "rms_norm_eps": 1e-6, "max_position_embeddings": 40960}


def _llama3(hidden, intermediate, layers, heads, tied, factor, head_dim=None):
  return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": intermediate,
          "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 8,
          "head_dim": head_dim or hidden // heads, "vocab_size": 128256, "tie_word_embeddings": tied,
          "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
          "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}}


def _smollm2(hidden, intermediate, layers, heads, kv_heads, rope_theta):
  return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": intermediate,
          "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
          "vocab_size": 49152, "tie_word_embeddings": True, "rope_theta": rope_theta, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 8192}


SHAPES = {
    "qwen2.5-0.5b": _qwen2(896, 4864, 24, 14, 2, tied=True),
    "qwen2.5-1.5b": _qwen2(1536, 8960, 28, 12, 2, tied=True),
    "qwen2.5-3b": _qwen2(2048, 11008, 36, 16, 2, tied=True),
    "qwen2.5-7b": _qwen2(3584, 18944, 28, 28, 4, tied=False, vocab=152064),
    "llama-3.2-1b": _llama3(2048, 8192, 16, 32, tied=True, factor=32.0, head_dim=64),
    "llama-3.2-3b": _llama3(3072, 8192, 28, 24, tied=True, factor=32.0, head_dim=128),
    "llama-3.1-8b": _llama3(4096, 14336, 32, 32, tied=False, factor=8.0),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, 8, tied=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, 8, tied=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, 8, tied=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, 8, tied=False),
    "smollm2-135m": _smollm2(576, 1536, 30, 9, 3, rope_theta=100000.0),
    "smollm2-1.7b": _smollm2(2048, 8192, 24, 32, 32, rope_theta=130000.0),
}


def shape_config(name: str, **computation) -> ModelConfig:
  """The `ModelConfig` of built-in shape `name` (`computation`: dtype, remat, ... as in `load_pretrained`)."""
  if name not in SHAPES:
    raise ValueError(f"unknown model shape {name!r}; built in: {', '.join(SHAPES)}")
  return ModelConfig.from_hf(SHAPES[name], **computation)
