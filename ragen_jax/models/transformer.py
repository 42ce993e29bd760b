"""Llama / Qwen2 / Qwen3 decoder in Flax Linen, applied through pure functions over params.

One block definition is scanned over layers (`nn.scan`), so parameters are
stacked with a leading `layers` axis; a decode step can instead run the layers
unrolled over per-layer weights (`unstack_layers`). The KV cache is an explicit argument and
result; it never lives in a mutable collection. Positions default to
"number of valid tokens before this one", so left padding, padded chunks and
cache continuation all give the positions a packed sequence would have.

Context windows (dropping old turns) are attention masks over segments: every
token carries a segment id (0: always visible, e.g. the system prompt; k + 1:
turn k) and every query a `visible_from` segment; a query sees the keys of
segment 0 and of segments >= its `visible_from`. Positions keep counting.
"""

from __future__ import annotations

import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ragen_jax.models.config import ModelConfig
from ragen_jax.models.partitioning import constrain

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@flax.struct.dataclass
class KVCache:
  """Preallocated key/value cache for all layers.

  k, v: float[L, B, K, S, H] (layers, batch, kv heads, slots, head dim): per (row, head)
    the slots are contiguous, the layout the attention dots read without a transpose.
  valid: bool[B, S], slots that hold a real token.
  segment: int32[B, S], each slot's segment id (see the module docstring).
  end: int32[], the next slot to write (shared by all rows; padded rows leave holes).
  """

  KV_AXES = ("cache_layers", "batch", "act_kv_heads", "cache_length", "head_dim")  # logical axes of k and v

  k: jax.Array
  v: jax.Array
  valid: jax.Array
  segment: jax.Array
  end: jax.Array

  @classmethod
  def zeros(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    shape = (config.num_layers, batch, config.num_kv_heads, max_len, config.head_dim)
    dtype = dtype or config.compute_dtype
    return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
               valid=jnp.zeros((batch, max_len), bool), segment=jnp.zeros((batch, max_len), jnp.int32),
               end=jnp.zeros((), jnp.int32))

  @property
  def max_len(self) -> int:
    return self.k.shape[3]

  @property
  def lengths(self) -> jax.Array:
    """int32[B]: number of real tokens per row."""
    return self.valid.sum(-1).astype(jnp.int32)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
  """Inverse rotary frequencies float32[H/2], with Llama-3 / linear scaling."""
  dim = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  if config.rope_scaling is None:
    return inv_freq
  scaling = dict(config.rope_scaling)
  rope_type = scaling.get("rope_type", scaling.get("type"))
  if rope_type == "linear":
    return inv_freq / scaling["factor"]
  if rope_type == "llama3":
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return jnp.where(medium, smoothed, scaled)
  return inv_freq


def apply_rope(x_BTNH: jax.Array, positions_BT: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotary embedding in HF's rotate-half layout, computed in float32."""
  angles = positions_BT[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
  cos = jnp.cos(jnp.concatenate([angles, angles], -1))[:, :, None, :]
  sin = jnp.sin(jnp.concatenate([angles, angles], -1))[:, :, None, :]
  x = x_BTNH.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
  return (x * cos + rotated * sin).astype(x_BTNH.dtype)


class RMSNorm(nn.Module):
  eps: float
  param_dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    return scale.astype(x.dtype) * x32.astype(x.dtype)


def _dense(features, axes, config: ModelConfig, name, use_bias=False):
  return nn.Dense(
      features, use_bias=use_bias, dtype=config.compute_dtype, param_dtype=config.weight_dtype,
      kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, axes[1:]), name=name)


class LoraAdapter(nn.Module):
  """The LoRA update `scale * (x a) b` of a projection with logical axes `axes` (`models.lora`): `a` [in, r] is
  sharded like the kernel's input axis, `b` [r, out] (zeros at init) like its output axis. The adapters are kept in
  float32 whatever `param_dtype` the frozen base has (a bfloat16 base halves the weights; what is trained keeps
  float32 precision)."""

  rank: int
  features: int
  axes: tuple[str, str]
  scale: float
  config: ModelConfig

  @nn.compact
  def __call__(self, x_ND):
    cfg = self.config
    init_a = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")  # PEFT's kaiming_uniform(a=sqrt(5))
    a = self.param("a", nn.with_logical_partitioning(init_a, (self.axes[0], "lora_rank")),
                   (x_ND.shape[-1], self.rank), jnp.float32)
    b = self.param("b", nn.with_logical_partitioning(nn.initializers.zeros, ("lora_rank", self.axes[1])),
                   (self.rank, self.features), jnp.float32)
    dtype = cfg.compute_dtype
    return (x_ND.astype(dtype) @ a.astype(dtype)) @ b.astype(dtype) * jnp.asarray(self.scale, dtype)


def _projection(features, axes, config: ModelConfig, name, use_bias=False):
  """The layer's Dense `name`, plus its LoRA adapter `<name>_lora` when `config.lora` targets it."""
  dense = _dense(features, axes, config, name, use_bias)
  if config.lora is None or name not in config.lora.projections:
    return dense
  adapter = LoraAdapter(config.lora.rank, features, axes, config.lora.scale, config, name=name + "_lora")
  return lambda x_ND: dense(x_ND) + adapter(x_ND)


def attention(q_BTNH, k_BSKH, v_BSKH, mask_BTS):
  """Grouped-query softmax attention (float32 softmax): query head n reads kv head n // (N / K).

  The kv heads are repeated to the query heads, the layout XLA:CPU runs fastest.
  """
  groups = q_BTNH.shape[2] // k_BSKH.shape[2]
  k_BSNH, v_BSNH = jnp.repeat(k_BSKH, groups, axis=2), jnp.repeat(v_BSKH, groups, axis=2)
  scores = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH, preferred_element_type=jnp.float32)
  scores = scores / math.sqrt(q_BTNH.shape[-1])
  scores = jnp.where(mask_BTS[:, None], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_BSNH.dtype)
  return jnp.einsum("bnts,bsnh->btnh", probs, v_BSNH)


QUERY_BLOCK = 128  # query rows per block of `causal_attention`


def causal_attention(q_BTNH, k_BTKH, v_BTKH, mask_BTT, block: int = QUERY_BLOCK):
  """`attention` under a causal mask (query t never sees key s > t), by blocks of `block` queries
  that each read only the keys up to their last query: about half the work of the full square
  at long T. Outputs of queries that see no key at all (padding) are unspecified."""
  t = q_BTNH.shape[1]
  return jnp.concatenate(
      [attention(q_BTNH[:, i:i + block], k_BTKH[:, :i + block], v_BTKH[:, :i + block],
                 mask_BTT[:, i:i + block, :i + block]) for i in range(0, t, block)], axis=1)


def _in_window(key_segment_BS, visible_from_BT):
  """bool[B, T, S]: the key's segment is always visible (0) or within the query's window."""
  key = key_segment_BS[:, None, :]
  return (key == 0) | (key >= visible_from_BT[:, :, None])


CACHE_BLOCK = 128  # key slots per step of `cached_attention`


def cached_attention(q_BTNH, cache_k, cache_v, layer, mask_BTS, key_end, block: int = CACHE_BLOCK):
  """`attention` over layer `layer` of a [L, B, K, S, H] cache, reading only slots < key_end.

  Blocks of `block` slots are visited with an online softmax (a dynamic trip count), so a
  step costs what the filled part of the cache costs, not the whole preallocated cache, and
  no per-layer copy of the cache is made. A ragged last block is read from S - block with
  the slots already seen masked out.
  """
  b, t, n, h = q_BTNH.shape
  kv, slots = cache_k.shape[2], cache_k.shape[3]
  block = min(block, slots)
  q = q_BTNH.reshape(b, t, kv, n // kv, h).astype(jnp.float32) / math.sqrt(h)
  num_blocks = (key_end + block - 1) // block

  def visit(i, carry):
    max_BKGT, sum_BKGT, out_BKGTH = carry
    start = jnp.minimum(i * block, slots - block)
    take = lambda c: jax.lax.dynamic_slice(c, (layer, 0, 0, start, 0), (1, b, kv, block, h))[0]  # noqa: E731
    keys, values = take(cache_k).astype(jnp.float32), take(cache_v).astype(jnp.float32)
    fresh = (start + jnp.arange(block)) >= i * block
    mask_BTS_blk = jax.lax.dynamic_slice_in_dim(mask_BTS, start, block, axis=2) & fresh
    scores = jnp.einsum("btkgh,bksh->bkgts", q, keys)
    scores = jnp.where(mask_BTS_blk[:, None, None], scores, _MASK_VALUE)
    new_max = jnp.maximum(max_BKGT, jnp.max(scores, axis=-1))
    probs = jnp.exp(scores - new_max[..., None])
    scale = jnp.exp(max_BKGT - new_max)
    out = out_BKGTH * scale[..., None] + jnp.einsum("bkgts,bksh->bkgth", probs, values)
    return new_max, sum_BKGT * scale + jnp.sum(probs, axis=-1), out

  shape = (b, kv, n // kv, t)
  init = (jnp.full(shape, _MASK_VALUE, jnp.float32), jnp.zeros(shape, jnp.float32),
          jnp.zeros(shape + (h,), jnp.float32))
  if slots == block:  # no loop: around a one-block loop XLA:CPU copied the whole V cache twice in every layer
    # (`bench/update.py --models demo --tokens 128 --rollout`: 35% of the rollout in `bench/profiling.py`'s profile)
    _, total, out = visit(0, init)
  else:
    _, total, out = jax.lax.fori_loop(0, num_blocks, visit, init)
  out = out / total[..., None]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(q_BTNH.dtype)


class Block(nn.Module):
  """Pre-norm attention + SwiGLU block; scanned over layers.

  The projections run on [B * T, D] rows: their weight gradients are then plain matmuls, where
  [B, T, D] inputs (two contracting dims) made XLA:CPU transpose whole activations in the backward.
  """

  config: ModelConfig

  @nn.compact
  def __call__(self, carry, layer, positions_BT, mask_BTS, write_index):
    """carry = (x_BTD, (k_LBKSH, v_LBKSH) or None); the whole cache rides in the carry so
    each layer's new keys are written in place at [layer, :, write_index]."""
    x_BTD, cache_kv = carry
    cfg = self.config
    n, kv, h = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    b, t, _ = x_BTD.shape
    inv_freq = rope_inv_freq(cfg)

    y = RMSNorm(cfg.rms_norm_eps, cfg.weight_dtype, name="input_layernorm")(x_BTD).reshape(b * t, -1)
    q = _projection(n * h, ("embed", "heads"), cfg, "q_proj", cfg.attention_bias)(y).reshape(b, t, n, h)
    k = _projection(kv * h, ("embed", "kv_heads"), cfg, "k_proj", cfg.attention_bias)(y).reshape(b, t, kv, h)
    v = _projection(kv * h, ("embed", "kv_heads"), cfg, "v_proj", cfg.attention_bias)(y).reshape(b, t, kv, h)
    if cfg.qk_norm:  # Qwen3: each head's query and key normalised over the head dim, before the rotation
      q = RMSNorm(cfg.rms_norm_eps, cfg.weight_dtype, name="q_norm")(q)
      k = RMSNorm(cfg.rms_norm_eps, cfg.weight_dtype, name="k_norm")(k)
    q = apply_rope(q, positions_BT, inv_freq)
    k = apply_rope(k, positions_BT, inv_freq)
    q = constrain(q, ("batch", "length", "act_heads", "head_dim"))

    if cache_kv is None:
      out = causal_attention(q, k, v, mask_BTS)
    else:
      k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, H], the cache's layout
      cache_k, cache_v = cache_kv
      start = (layer, 0, 0, write_index, 0)
      cache_k = jax.lax.dynamic_update_slice(cache_k, k[None].astype(cache_k.dtype), start)
      cache_v = jax.lax.dynamic_update_slice(cache_v, v[None].astype(cache_v.dtype), start)
      cache_kv = (cache_k, cache_v)
      out = cached_attention(q, cache_k, cache_v, layer, mask_BTS, write_index + t)
    out = _projection(cfg.hidden_size, ("heads", "embed"), cfg, "o_proj")(out.reshape(b * t, n * h)).reshape(b, t, -1)
    x_BTD = constrain(x_BTD + out, ("batch", "length", "act_embed"))

    y = RMSNorm(cfg.rms_norm_eps, cfg.weight_dtype, name="post_attention_layernorm")(x_BTD).reshape(b * t, -1)
    gate = _projection(cfg.intermediate_size, ("embed", "mlp"), cfg, "gate_proj")(y)
    up = _projection(cfg.intermediate_size, ("embed", "mlp"), cfg, "up_proj")(y)
    hidden = constrain(nn.silu(gate) * up, ("batch", "act_mlp"))  # rows: batch x length
    x_BTD = x_BTD + _projection(cfg.hidden_size, ("mlp", "embed"), cfg, "down_proj")(hidden).reshape(b, t, -1)
    return (constrain(x_BTD, ("batch", "length", "act_embed")), cache_kv), None


def unstack_layers(params) -> list:
  """Each layer's weights, sliced out of the stacked `params["layers"]`: `Transformer`'s `layer_params`.

  A decode step that scans the stack slices every layer's weights at every step; XLA:CPU copies them (14% of a
  SmolLM2-135M decode step at batch 16 in `bench/sampler.py`'s profile). Sliced once per decode (`decode_layers`
  "unrolled"), they cost one more copy of the layers' weights while it runs (bench/RESULTS.md 2026-12-06: 1.34x
  tokens/s at batch 1 on one CPU device). With FSDP-sharded weights XLA then gathers every layer at once: the
  plan of Qwen2.5-3B on 16 v5e (`ragen_jax.plan`) grows the rollout's peak from 10.6 to 21.0 GiB per chip, and
  its compilation from 55 to 568 s. Hence `scan` is the default.
  """
  stacked = params["layers"]
  return [jax.tree.map(lambda w, i=i: w[i], stacked) for i in range(jax.tree.leaves(stacked)[0].shape[0])]


def remat_policy(remat: str):
  """The `jax.checkpoint` policy of `ModelConfig.remat` ("none": None, no rematerialisation)."""
  return {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
          "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[remat]


class Transformer(nn.Module):
  """Decoder-only LM. `__call__` returns final hidden states (and the updated cache).

  Use `lm_logits` / `values` (via `apply(..., method=...)`) on the hidden states.
  With `with_value_head`, a scalar head on the final hidden state serves as a PPO critic.
  """

  config: ModelConfig
  with_value_head: bool = False

  def setup(self):
    cfg = self.config
    self.embed_tokens = nn.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype,
        embedding_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")))
    # With remat, the backward recomputes what a layer does not save from its input (forward-only calls, the
    # sampler's, run the same ops: a checkpoint only changes what differentiation keeps).
    block = Block if cfg.remat == "none" else nn.remat(Block, policy=remat_policy(cfg.remat), prevent_cse=False)
    self.layers = nn.scan(
        block, variable_axes={"params": 0}, split_rngs={"params": True},
        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"})(cfg)
    self.norm = RMSNorm(cfg.rms_norm_eps, cfg.weight_dtype)
    if not cfg.tie_word_embeddings:
      self.lm_head = _dense(cfg.vocab_size, ("embed", "vocab"), cfg, None)
    if self.with_value_head:
      self.value_head = nn.Dense(
          1, dtype=jnp.float32, param_dtype=jnp.float32,
          kernel_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed", "value")),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("value",)))

  def __call__(self, tokens_BT, valid_BT=None, cache: KVCache | None = None, positions_BT=None,
               segment_BT=None, visible_from_BT=None, layer_params=None):
    """Runs the decoder on `tokens_BT`; with `cache`, appends them at `cache.end`.

    valid_BT marks real tokens (default: all). Invalid ones are never attended to.
    segment_BT / visible_from_BT (default: 0, everything visible) limit each query's
    context to whole segments (see the module docstring).
    layer_params: None (the stacked layers, scanned) or `unstack_layers(params)`, run one after another.
    Returns (hidden_BTD, new_cache or None).
    """
    b, t = tokens_BT.shape
    valid_BT = jnp.ones((b, t), bool) if valid_BT is None else valid_BT.astype(bool)
    past = jnp.zeros((b,), jnp.int32) if cache is None else cache.lengths
    if positions_BT is None:
      positions_BT = past[:, None] + jnp.cumsum(valid_BT, -1, dtype=jnp.int32) - 1
    segment_BT = jnp.zeros((b, t), jnp.int32) if segment_BT is None else segment_BT.astype(jnp.int32)
    visible_from_BT = jnp.zeros((b, t), jnp.int32) if visible_from_BT is None else visible_from_BT
    x = self._embed(tokens_BT)

    if cache is None:
      slots = jnp.arange(t)
      mask = (valid_BT[:, None, :] & (slots[None, :, None] >= slots[None, None, :])
              & _in_window(segment_BT, visible_from_BT))
      x, _ = self._run_layers((x, None), layer_params, positions_BT, mask, 0)
      return self.norm(x), None

    write = cache.end
    key_valid = jax.lax.dynamic_update_slice(cache.valid, valid_BT, (0, write))
    key_segment = jax.lax.dynamic_update_slice(cache.segment, segment_BT, (0, write))
    q_slots = write + jnp.arange(t)
    mask = (key_valid[:, None, :] & (q_slots[None, :, None] >= jnp.arange(cache.max_len)[None, None, :])
            & _in_window(key_segment, visible_from_BT))
    x, (k, v) = self._run_layers((x, (cache.k, cache.v)), layer_params, positions_BT, mask, write)
    return self.norm(x), KVCache(k=k, v=v, valid=key_valid, segment=key_segment, end=write + t)

  def _embed(self, tokens_BT):
    """The tokens' rows of the embedding table, looked up where the table's shards lie, then given the batch layout.

    The table is split `vocab` over `tensor` and `embed` over `fsdp`, the batch over `data` x `fsdp`. Left to itself
    (with data, fsdp and tensor all above 1) XLA's partitioner looks the whole batch up on every device and cannot
    move the `embed`-split rows to the batch layout without replicating the [B, T, D] activations first
    ("Involuntary full rematerialization"). Here each device looks its `data` share of the tokens up in the table
    shard it holds (its `vocab` rows, summed over `tensor`; its `embed` columns), and one all-to-all over `fsdp`
    trades the `embed` split for the batch's. The tokens are put in the batch layout first, so that a scan over
    micro-batches hands them over in it.
    """
    table_VD = self.embed_tokens.embedding.astype(self.config.compute_dtype)
    rows_BTD = jnp.take(table_VD, constrain(tokens_BT, ("batch", "length")), axis=0)
    return constrain(constrain(rows_BTD, ("lookup_batch", "length", "lookup_embed")), ("batch", "length", "act_embed"))

  def _run_layers(self, carry, layer_params, positions_BT, mask_BTS, write_index):
    if layer_params is None:
      layer_ids = jnp.arange(self.config.num_layers, dtype=jnp.int32)
      return self.layers(carry, layer_ids, positions_BT, mask_BTS, write_index)[0]
    block = Block(self.config, parent=None)
    for layer, params in enumerate(layer_params):
      carry, _ = block.apply({"params": params}, carry, layer, positions_BT, mask_BTS, write_index)
    return carry

  def lm_logits(self, hidden_BTD):
    """float32 logits [B, T, V]."""
    hidden_ND = hidden_BTD.reshape(-1, hidden_BTD.shape[-1])
    if self.config.tie_word_embeddings:
      logits = self.embed_tokens.attend(hidden_ND)
    else:
      logits = self.lm_head(hidden_ND)
    logits = logits.reshape(*hidden_BTD.shape[:-1], -1)
    return constrain(logits.astype(jnp.float32), ("batch", "length", "act_vocab"))

  def values(self, hidden_BTD):
    """float32 critic values [B, T]."""
    return self.value_head(hidden_BTD.astype(jnp.float32))[..., 0]

  def logits_and_values(self, tokens_BT, valid_BT=None):
    hidden, _ = self(tokens_BT, valid_BT)
    return self.lm_logits(hidden), (self.values(hidden) if self.with_value_head else None)
