"""Decoder-only transformer configuration, read from and written to HF `config.json`."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp

if TYPE_CHECKING:
  from ragen_jax.models.lora import LoraConfig

# HF `model_type` / `architectures` we read and write.
_FAMILIES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",  # dense Qwen3: Qwen2 without q/k/v biases, RMSNorm of each head's q and k
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
REMAT = ("none", "full", "dots")  # what the backward keeps of each scanned layer (`transformer.remat_policy`)
DECODE_LAYERS = ("scan", "unrolled")  # how a decode step runs the layers (`transformer.Transformer.__call__`)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of one Llama/Qwen2/Qwen3-family model (hashable: a static jit arg).

  `qk_norm` (Qwen3): an RMSNorm over the head dim of every query and key head, before the rotary embedding.

  How it is computed, not what it is (never written to config.json): `dtype` / `param_dtype`; `remat`, what the
  backward keeps of each scanned layer (`none`: every activation; `full`: only the layer's input, the rest
  recomputed; `dots`: the matmul outputs); `logits_chunk`, tokens per block of the LM head when scoring
  (`scoring.token_logp_and_entropy`; 0: the whole sequence at once), so no [T, vocab] logits exist at once;
  `decode_layers`, how `sampling.decode` runs the layers: `scan`, each layer's weights sliced out of the stack at
  every step, or `unrolled`, sliced once per decode (`transformer.unstack_layers`: faster with weights on one
  device, but sharded weights are then gathered whole);
  `lora`, None or the LoRA adapters (`models.lora.LoraConfig`, rank >= 1) every layer's targeted projections carry.

  `rope_scaling` is None or a sorted tuple of (key, value) pairs from HF's dict
  (`rope_type` "llama3" or "linear").
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  model_type: str = "llama"
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  rms_norm_eps: float = 1e-5
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 2048
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  logits_chunk: int = 0
  decode_layers: str = "scan"
  lora: LoraConfig | None = None

  def __post_init__(self):
    if self.model_type not in _FAMILIES:
      raise ValueError(f"model_type {self.model_type!r} is not supported; use one of {sorted(_FAMILIES)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"{name}={getattr(self, name)!r}; use one of {sorted(DTYPES)}")
    if self.remat not in REMAT:
      raise ValueError(f"remat={self.remat!r}; use one of {REMAT}")
    if self.logits_chunk < 0:
      raise ValueError(f"logits_chunk={self.logits_chunk} must be >= 0 (0: no chunks)")
    if self.decode_layers not in DECODE_LAYERS:
      raise ValueError(f"decode_layers={self.decode_layers!r}; use one of {DECODE_LAYERS}")
    if self.lora is not None and self.lora.rank < 1:
      raise ValueError(f"lora rank {self.lora.rank}: a config with adapters needs rank >= 1 (no adapters: None)")
    if self.rope_scaling is not None:
      rope_type = dict(self.rope_scaling).get("rope_type", dict(self.rope_scaling).get("type"))
      if rope_type not in ("llama3", "linear", "default"):
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported (llama3, linear, default)")

  @property
  def compute_dtype(self):
    return DTYPES[self.dtype]

  @property
  def weight_dtype(self):
    return DTYPES[self.param_dtype]

  @classmethod
  def from_hf(cls, hf: dict[str, Any], **overrides) -> ModelConfig:
    """Builds a config from a parsed HF `config.json` dict."""
    model_type = hf.get("model_type", "llama")
    if model_type not in _FAMILIES:
      raise ValueError(f"model_type {model_type!r} is not supported; use one of {sorted(_FAMILIES)}")
    if hf.get("use_sliding_window"):
      raise ValueError("use_sliding_window=True is not supported")
    num_heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    # transformers >= 5 writes `rope_parameters`; older checkpoints `rope_theta` + `rope_scaling`.
    rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
    rope_theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling = None if rope.get("rope_type", rope.get("type", "default")) == "default" else rope
    kwargs = dict(
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        rope_theta=rope_theta,
        rope_scaling=None if scaling is None else tuple(sorted(scaling.items())),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos_ids,
        pad_token_id=hf.get("pad_token_id"),
    )
    kwargs.update(overrides)
    return cls(**kwargs)

  def to_hf(self) -> dict[str, Any]:
    """The HF `config.json` dict that transformers loads as this model."""
    hf = {
        "architectures": [_FAMILIES[self.model_type]],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rope_theta": self.rope_theta,
        "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
        "rms_norm_eps": self.rms_norm_eps,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        "pad_token_id": self.pad_token_id,
        "torch_dtype": self.param_dtype,
    }
    if self.model_type == "llama":
      hf["attention_bias"] = self.attention_bias
      hf["mlp_bias"] = False
    else:
      hf["use_sliding_window"] = False
    if self.model_type == "qwen3":
      hf["attention_bias"] = self.attention_bias
    return hf
