"""Analytic FLOPs of the transformer's forward and training passes (what the planner and the benchmarks count).

2 FLOPs per multiply-add, matmuls and attention's two products only (norms, activations, softmax not counted).
"""

from __future__ import annotations

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.transformer import QUERY_BLOCK


def projection_shapes(c: ModelConfig) -> dict[str, tuple[int, int]]:
  """(inputs, outputs) of each projection of a decoder layer."""
  d, q, kv, mlp = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size
  return {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d), "gate_proj": (d, mlp),
          "up_proj": (d, mlp), "down_proj": (mlp, d)}


def adapter_matmul_params(c: ModelConfig) -> int:
  """Weights of one decoder layer's LoRA adapters (both factors; 0 without LoRA)."""
  shapes = projection_shapes(c)
  return 0 if c.lora is None else sum(c.lora.rank * sum(shapes[name]) for name in c.lora.projections)


def layer_matmul_params(c: ModelConfig) -> int:
  """Weights of one decoder layer's matmuls (q, k, v, o, the SwiGLU MLP, and LoRA adapters' two factors)."""
  return sum(i * o for i, o in projection_shapes(c).values()) + adapter_matmul_params(c)


def forward_flops(c: ModelConfig, tokens: int, key_pairs: int, head_tokens: int) -> float:
  """FLOPs of a forward pass over `tokens` tokens whose queries read `key_pairs` (query, key) pairs in all, with
  the LM head on `head_tokens` of them: 2 per multiply-add of every matmul and of attention's two products."""
  per_layer = 2 * tokens * layer_matmul_params(c) + 4 * key_pairs * c.num_heads * c.head_dim
  return c.num_layers * per_layer + 2 * head_tokens * c.hidden_size * c.vocab_size


def train_pass_flops(c: ModelConfig, tokens: int, key_pairs: int, head_tokens: int) -> float:
  """`forward_flops` and the backward: the inputs' gradients (one forward again) and the weights' gradients (one
  forward of the trained weights' matmuls: all of them, or under LoRA the adapters only; attention has none, so
  counting it there too makes this an upper bound)."""
  forward = forward_flops(c, tokens, key_pairs, head_tokens)
  if c.lora is None:
    return 3 * forward
  return 2 * forward + 2 * tokens * c.num_layers * adapter_matmul_params(c)


def causal_key_pairs(length: int, block: int = QUERY_BLOCK) -> int:
  """(query, key) pairs `transformer.causal_attention` computes over one sequence (by blocks of queries)."""
  return sum(min(block, length - i) * min(i + block, length) for i in range(0, length, block))
