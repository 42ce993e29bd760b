"""Logit parity with transformers' PyTorch models, sharding, import/export."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from ragen_jax import mesh as mesh_lib
from ragen_jax.models import CheckpointError, ModelConfig, load_pretrained
from ragen_jax.models.model import forward_logits, put_batch
from tests.models.hf_fixtures import VARIANTS, make_hf_model, save_hf_model


def _tokens(vocab, batch=3, length=17, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int32)


def _torch_logits(hf_model, tokens, attention_mask=None):
  with torch.no_grad():
    kwargs = {} if attention_mask is None else {"attention_mask": torch.tensor(attention_mask)}
    return hf_model(torch.tensor(tokens, dtype=torch.long), **kwargs).logits.numpy()


def _max_rel_err(ours, ref):
  return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(variant, tmp_path):
  hf_model = save_hf_model(variant, tmp_path)
  model = load_pretrained(tmp_path)
  tokens = _tokens(model.config.vocab_size)
  assert _max_rel_err(np.asarray(model.logits(tokens)), _torch_logits(hf_model, tokens)) <= 1e-4


def test_left_padding_matches_transformers(tmp_path):
  hf_model = save_hf_model("qwen2_bias", tmp_path)
  model = load_pretrained(tmp_path)
  tokens = _tokens(model.config.vocab_size, batch=2, length=12)
  valid = np.ones_like(tokens, bool)
  valid[0, :5] = False  # row 0 is left-padded
  ref = _torch_logits(hf_model, tokens[:1, 5:])
  ours = np.asarray(model.logits(tokens, valid))
  assert _max_rel_err(ours[0, 5:], ref[0]) <= 1e-4


@pytest.mark.parametrize("variant", ["llama_untied", "qwen3_untied"])
def test_sharded_logits_equal_single_device(variant, tmp_path):
  assert jax.device_count() == 8
  save_hf_model(variant, tmp_path)
  single = load_pretrained(tmp_path)
  sharded = load_pretrained(tmp_path, mesh=mesh_lib.make_mesh(data=1, fsdp=4, tensor=2))
  kernel = sharded.params["layers"]["gate_proj"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  assert len(kernel.addressable_shards) == 8 and kernel.addressable_shards[0].data.shape == (2, 16, 48)
  tokens = _tokens(single.config.vocab_size, batch=8)
  np.testing.assert_allclose(np.asarray(sharded.logits(tokens)), np.asarray(single.logits(tokens)),
                             atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", ["llama_tied_mha", "qwen3_untied"])
def test_a_three_axis_mesh_partitions_the_forward_and_backward_without_replicating(variant, tmp_path, capfd):
  """On data x fsdp x tensor = 2x2x2 the logits and their gradient equal one device's, and XLA partitions them,
  alone and over micro-batches, without replicating a tensor on every device first (it once did so with the
  embedding lookup's [B, T, D] output, logging "Involuntary full rematerialization")."""
  save_hf_model(variant, tmp_path)
  single = load_pretrained(tmp_path)
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  sharded = load_pretrained(tmp_path, mesh=mesh)
  tokens = _tokens(single.config.vocab_size, batch=8)
  logits = jax.jit(lambda params, tokens_BT: forward_logits(single.config, params, tokens_BT))
  grad = jax.jit(jax.grad(lambda params, tokens_BT: logits(params, tokens_BT).max(-1).mean()))
  by_micro_batch = jax.jit(lambda params, tokens_BT: jax.lax.map(  # as scoring and the update scan micro-batches
      lambda micro_bT: logits(params, micro_bT), tokens_BT.reshape(4, 2, -1)))
  capfd.readouterr()
  cache_enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)  # XLA logs while it compiles, not on a cache hit
  try:
    with jax.set_mesh(mesh):
      tokens_on_mesh = put_batch(mesh, tokens)
      for program in (logits, grad, by_micro_batch):
        program.lower(sharded.params, tokens_on_mesh).compile()
  finally:
    jax.config.update("jax_enable_compilation_cache", cache_enabled)
  assert "rematerialization" not in capfd.readouterr().err
  with jax.set_mesh(mesh):
    sharded_logits, grads = sharded.logits(tokens), grad(sharded.params, tokens_on_mesh)
  np.testing.assert_allclose(np.asarray(sharded_logits), np.asarray(single.logits(tokens)), atol=1e-5, rtol=1e-5)
  for ours, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(grad(single.params, tokens))):
    np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("variant", ["qwen2_bias", "qwen3_untied"])
def test_export_round_trip_is_exact_and_loads_in_transformers(variant, tmp_path):
  hf_model = save_hf_model(variant, tmp_path / "src")
  model = load_pretrained(tmp_path / "src")
  model.export(tmp_path / "out")
  again = load_pretrained(tmp_path / "out")
  for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
  tokens = _tokens(model.config.vocab_size)
  np.testing.assert_allclose(_torch_logits(reloaded, tokens), _torch_logits(hf_model, tokens), atol=1e-6)


def test_sharded_index_checkpoint(tmp_path):
  hf_model = save_hf_model("llama_untied", tmp_path, save_kwargs={"max_shard_size": "100KB"})
  assert (tmp_path / "model.safetensors.index.json").is_file()
  assert len(list(tmp_path.glob("*.safetensors"))) > 1
  model = load_pretrained(tmp_path)
  tokens = _tokens(model.config.vocab_size)
  assert _max_rel_err(np.asarray(model.logits(tokens)), _torch_logits(hf_model, tokens)) <= 1e-4


def test_missing_tensor_is_named(tmp_path):
  from safetensors.numpy import load_file, save_file
  save_hf_model("llama_untied", tmp_path)
  tensors = load_file(tmp_path / "model.safetensors")
  del tensors["model.layers.1.mlp.up_proj.weight"]
  save_file(tensors, tmp_path / "model.safetensors")
  with pytest.raises(CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
    load_pretrained(tmp_path)


def test_wrong_shape_is_named(tmp_path):
  save_hf_model("llama_untied", tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  config["intermediate_size"] = 100
  (tmp_path / "config.json").write_text(json.dumps(config))
  expected = r"'model.layers.0.mlp.down_proj.weight' has shape \(64, 96\), expected \(64, 100\)"
  with pytest.raises(CheckpointError, match=expected):
    load_pretrained(tmp_path)


def test_not_a_model_directory(tmp_path):
  with pytest.raises(CheckpointError, match="config.json"):
    load_pretrained(tmp_path)


def test_bfloat16_compute_is_close(tmp_path):
  hf_model = save_hf_model("llama_untied", tmp_path)
  model = load_pretrained(tmp_path, dtype="bfloat16")
  assert model.params["layers"]["q_proj"]["kernel"].dtype == jax.numpy.bfloat16
  tokens = _tokens(model.config.vocab_size)
  assert _max_rel_err(np.asarray(model.logits(tokens)), _torch_logits(hf_model, tokens)) <= 5e-2


@pytest.mark.parametrize("variant", ["llama_tied_mha", "qwen3_untied"])
def test_config_round_trip(variant):
  hf_model = make_hf_model(variant)
  config = ModelConfig.from_hf(hf_model.config.to_dict())
  assert ModelConfig.from_hf(config.to_hf()) == config
  assert config.qk_norm == variant.startswith("qwen3") and not config.attention_bias
  with pytest.raises(ValueError, match="model_type 'gpt2' is not supported; use one of \['llama', 'qwen2', 'qwen3'\]"):
    ModelConfig.from_hf({**config.to_hf(), "model_type": "gpt2"})


def test_bundled_smollm2_predicts_paris_and_matches_transformers(smollm2_dir):
  tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
  model = load_pretrained(smollm2_dir)
  tokens = np.asarray([tokenizer.encode("The capital of France is")], np.int32)
  ours = np.asarray(model.logits(tokens))
  assert tokenizer.decode([int(ours[0, -1].argmax())]) == " Paris"
  assert _max_rel_err(ours, _torch_logits(hf_model, tokens)) <= 1e-4


@pytest.mark.parametrize("slots,key_end,block", [(50, 50, 16), (50, 37, 16), (50, 5, 64), (64, 64, 16), (64, 20, 8)])
def test_cached_attention_reads_only_the_filled_blocks_and_equals_full_attention(slots, key_end, block):
  from ragen_jax.models.transformer import attention, cached_attention
  rng = np.random.default_rng(slots + key_end)
  b, t, n, kv, h, layers = 2, 3, 4, 2, 8, 2
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
  cache_k, cache_v = (jnp.asarray(rng.normal(size=(layers, b, kv, slots, h)), jnp.float32) for _ in range(2))
  mask = jnp.asarray(rng.random((b, t, slots)) < 0.6) & (jnp.arange(slots) < key_end)
  mask = mask.at[:, :, 0].set(True)  # every query sees at least one key
  expected = attention(q, cache_k[1].transpose(0, 2, 1, 3), cache_v[1].transpose(0, 2, 1, 3), mask)
  got = jax.jit(cached_attention, static_argnames="block")(q, cache_k, cache_v, 1, mask, key_end, block=block)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  # Blocks past key_end are never read: NaN there changes nothing.
  unread = -(-key_end // block) * block
  if unread < slots:
    poisoned = cache_k.at[:, :, :, unread:].set(jnp.nan), cache_v.at[:, :, :, unread:].set(jnp.nan)
    np.testing.assert_allclose(cached_attention(q, *poisoned, 1, mask, key_end, block=block), expected, atol=1e-5)


@pytest.mark.parametrize("t,block", [(50, 16), (64, 64), (64, 8), (7, 16)])
def test_causal_attention_by_query_blocks_equals_full_attention(t, block):
  from ragen_jax.models.transformer import attention, causal_attention
  rng = np.random.default_rng(t + block)
  b, n, kv, h = 3, 4, 2, 8
  q, k, v = (jnp.asarray(rng.normal(size=(b, t, heads, h)), jnp.float32) for heads in (n, kv, kv))
  valid = jnp.asarray(rng.random((b, t)) < 0.8).at[:, 0].set(True)
  window = jnp.asarray(rng.random((b, t, t)) < 0.7).at[:, :, 0].set(True)  # dropped turns; key 0 always seen
  mask = valid[:, None, :] & (jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]) & window
  expected = attention(q, k, v, mask)
  got = jax.jit(causal_attention, static_argnames="block")(q, k, v, mask, block=block)
  np.testing.assert_allclose(got, expected, atol=1e-5)
