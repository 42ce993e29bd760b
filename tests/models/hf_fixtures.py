"""Tiny random transformers checkpoints saved with `save_pretrained` (the peer we test against)."""

import torch
import transformers

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)

VARIANTS = {
    "llama_untied": ("llama", dict(tie_word_embeddings=False, rope_theta=10000.0)),
    "llama_tied_mha": ("llama", dict(tie_word_embeddings=True, num_key_value_heads=4, rope_theta=500000.0,
                                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16})),
    "qwen2_bias": ("qwen2", dict(tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "qwen2_tied_mqa": ("qwen2", dict(tie_word_embeddings=True, num_key_value_heads=1)),
    # head_dim set apart from hidden / heads, as Qwen3's checkpoints do
    "qwen3_untied": ("qwen3", dict(tie_word_embeddings=False, head_dim=24, rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "qwen3_tied_mqa": ("qwen3", dict(tie_word_embeddings=True, num_key_value_heads=1)),
}
CONFIG_CLASSES = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "qwen3": transformers.Qwen3Config}


def make_hf_model(variant: str, seed: int = 0, **config_overrides):
  """A random tiny HF PyTorch model (float32) for `variant`, with non-trivial norms and biases.

  A larger `initializer_range` (e.g. 0.3) gives peaked logits, so greedy decoding has no near-ties.
  """
  family, extra = VARIANTS[variant]
  config = CONFIG_CLASSES[family](**{**TINY, **extra, **config_overrides})
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
  return model


def save_hf_model(variant: str, path, seed: int = 0, save_kwargs=None, **config_overrides):
  model = make_hf_model(variant, seed, **config_overrides)
  model.save_pretrained(path, **(save_kwargs or {}))
  return model
