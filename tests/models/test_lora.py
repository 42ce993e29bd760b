"""LoRA adapters against their peers: PEFT's LoRA on transformers' PyTorch model, the merged export loaded by
transformers, the gradient of the merged weight, and sharded = one device."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
import transformers

from ragen_jax import mesh as mesh_lib
from ragen_jax.assembly import load_model
from ragen_jax.config import ConfigError
from ragen_jax.models import CheckpointError, forward_logits, load_pretrained
from ragen_jax.models import lora
from ragen_jax.scoring import token_logp_and_entropy
from tests.models.hf_fixtures import save_hf_model

LORA = lora.LoraConfig(rank=4, alpha=8.0)


def _tokens(vocab, batch=4, length=13, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int32)


def _with_random_adapters(model, seed=1):
  """`model` with adapters drawn at random (fresh ones have b = 0, which would hide a wrong b)."""
  base, adapters = lora.split(model.config, model.params)
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(adapters))))
  adapters = jax.tree.map(lambda x: (x + 0.2 * jax.random.normal(next(keys), x.shape)).astype(x.dtype), adapters)
  return dataclasses.replace(model, params=lora.combine(base, adapters))


def _torch_logits(hf_model, tokens):
  with torch.no_grad():
    return hf_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


def _max_rel_err(ours, ref):
  return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("variant,targets", [("qwen2_bias", tuple(lora.PROJECTIONS)), ("qwen3_untied", ("q", "v"))])
def test_adapters_match_peft_and_the_merged_export_loads_in_transformers(variant, targets, tmp_path):
  save_hf_model(variant, tmp_path / "base")
  config = dataclasses.replace(LORA, targets=targets)
  model = _with_random_adapters(load_pretrained(tmp_path / "base", lora=config))
  assert {k for k in model.params["layers"] if k.endswith("_lora")} == {f"{t}_proj_lora" for t in targets}
  tokens = _tokens(model.config.vocab_size)
  ours = np.asarray(model.logits(tokens))
  base_logits = np.asarray(forward_logits(lora.without(model.config), lora.split(model.config, model.params)[0],
                                          tokens))
  assert _max_rel_err(ours, base_logits) > 1e-2  # the adapters change the model

  # the adapters alone, in PEFT's layout, on transformers' model of the base checkpoint
  lora.save_adapters(model.config, lora.split(model.config, model.params)[1], tmp_path / "adapters", "base")
  base_hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").float().eval()
  peft_model = peft.PeftModel.from_pretrained(base_hf, tmp_path / "adapters").eval()
  assert _max_rel_err(ours, _torch_logits(peft_model, tokens)) <= 1e-4

  # the merged model, as transformers loads it
  model.export(tmp_path / "merged")
  merged_hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").float().eval()
  assert _max_rel_err(ours, _torch_logits(merged_hf, tokens)) <= 1e-4

  # and the adapters read back are the ones written
  reloaded = load_pretrained(tmp_path / "base", lora=config, adapters=tmp_path / "adapters")
  for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(reloaded.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fresh_adapters_and_adapters_off_are_the_base_model(tmp_path):
  save_hf_model("llama_untied", tmp_path)
  plain = load_pretrained(tmp_path)
  adapted = load_pretrained(tmp_path, lora=LORA)
  base, adapters = lora.split(adapted.config, adapted.params)
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves({k: v["b"] for k, v in adapters["layers"].items()}))
  assert all(np.any(np.asarray(v["a"])) for v in adapters["layers"].values())
  tokens = _tokens(plain.config.vocab_size)
  np.testing.assert_array_equal(np.asarray(adapted.logits(tokens)), np.asarray(plain.logits(tokens)))
  # the reference under LoRA: the same base arrays, scored with adapters off
  assert jax.tree.structure(base) == jax.tree.structure(plain.params)
  np.testing.assert_array_equal(np.asarray(forward_logits(lora.without(adapted.config), base, tokens)),
                                np.asarray(plain.logits(tokens)))
  # a bfloat16 base keeps float32 adapters (what is trained keeps its precision)
  half = load_pretrained(tmp_path, dtype="bfloat16", lora=LORA)
  half_base, half_adapters = lora.split(half.config, half.params)
  assert {x.dtype for x in jax.tree.leaves(half_base)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(half_adapters)} == {jnp.dtype(jnp.float32)}


def test_adapter_gradients_are_the_merged_weights_gradient_through_the_factors(tmp_path):
  """d loss / d a = s * G b^T and d loss / d b = s * a^T G, with G the gradient of the loss in the merged kernel."""
  save_hf_model("qwen2_bias", tmp_path)
  model = _with_random_adapters(load_pretrained(tmp_path, lora=LORA))
  config, scale = model.config, LORA.scale
  tokens = jnp.asarray(_tokens(config.vocab_size, batch=2))
  valid = jnp.ones_like(tokens, bool)
  base, adapters = lora.split(config, model.params)

  def adapted_loss(trainable):
    logp, entropy = token_logp_and_entropy(config, lora.combine(base, trainable), tokens, valid)
    return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

  def merged_loss(merged):
    logp, entropy = token_logp_and_entropy(lora.without(config), merged, tokens, valid)
    return jnp.sum(logp) + 0.1 * jnp.sum(entropy)

  grads = jax.grad(adapted_loss)(adapters)["layers"]
  merged_grads = jax.grad(merged_loss)(lora.merge(config, model.params))["layers"]
  for name in LORA.projections:
    a, b = adapters["layers"][name + "_lora"]["a"], adapters["layers"][name + "_lora"]["b"]
    g = merged_grads[name]["kernel"]
    # Each entry is a sum of products; float32 rounding scales with the sum of their magnitudes (`terms`), not
    # with the sum, which cancels to near 0 in some entries (AVX2 and AVX-512 machines round those differently).
    for actual, spec, x, y in ((grads[name + "_lora"]["a"], "lio,lro->lir", g, b),
                               (grads[name + "_lora"]["b"], "lir,lio->lro", a, g)):
      desired, terms = scale * jnp.einsum(spec, x, y), scale * jnp.einsum(spec, jnp.abs(x), jnp.abs(y))
      np.testing.assert_array_less(np.abs(actual - desired), 1e-4 * terms + 1e-12, err_msg=name)


def test_sharded_adapters_follow_their_kernels_and_equal_one_device(tmp_path):
  assert jax.device_count() == 8
  save_hf_model("llama_untied", tmp_path)
  single = _with_random_adapters(load_pretrained(tmp_path, lora=LORA))
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tensor=2)
  sharded = load_pretrained(tmp_path, mesh=mesh, lora=LORA)
  sharded = dataclasses.replace(sharded, params=jax.device_put(single.params, jax.tree.map(
      lambda x: x.sharding, sharded.params)))
  layers = sharded.params["layers"]
  spec = jax.sharding.PartitionSpec
  assert layers["q_proj_lora"]["a"].sharding.spec == spec(None, "fsdp", None)  # like the kernel's input axis
  assert layers["q_proj_lora"]["b"].sharding.spec == spec(None, None, "tensor")  # like its output axis
  assert layers["down_proj_lora"]["a"].sharding.spec == spec(None, "tensor", None)
  assert layers["down_proj_lora"]["b"].sharding.spec == spec(None, None, "fsdp")
  tokens = _tokens(single.config.vocab_size, batch=8)
  np.testing.assert_allclose(np.asarray(sharded.logits(tokens)), np.asarray(single.logits(tokens)), rtol=1e-5,
                             atol=1e-5)


def test_bad_settings_and_mismatched_adapters_are_one_line_errors(tmp_path):
  for kwargs, text in [({"rank": -1}, "model.lora.rank=-1"), ({"alpha": 0.0}, "model.lora.alpha=0.0"),
                       ({"dropout": 0.1}, "only 0 is supported"), ({"targets": ("q", "qq")}, "model.lora.targets"),
                       ({"targets": ("q", "q")}, "distinct")]:
    with pytest.raises(ConfigError, match=text):
      lora.LoraConfig(**kwargs)
  save_hf_model("llama_untied", tmp_path / "base")
  model = load_pretrained(tmp_path / "base", lora=LORA)
  lora.save_adapters(model.config, model.params, tmp_path / "adapters")
  with pytest.raises(CheckpointError, match=r"this run's model.lora asks for \{'r': 8"):
    load_pretrained(tmp_path / "base", lora=dataclasses.replace(LORA, rank=8), adapters=tmp_path / "adapters")
  with pytest.raises(CheckpointError, match="not a LoRA adapter directory"):
    load_pretrained(tmp_path / "base", lora=LORA, adapters=tmp_path / "base")


def test_a_run_loads_saved_adapters_onto_the_built_in_model(tmp_path):
  mesh = mesh_lib.single_device_mesh()
  model, _ = load_model("scratch:tiny", mesh, lora=LORA)
  trained = _with_random_adapters(model)
  lora.save_adapters(trained.config, trained.params, tmp_path)
  reloaded, _ = load_model("scratch:tiny", mesh, adapters=str(tmp_path), lora=LORA)
  for a, b in zip(jax.tree.leaves(trained.params), jax.tree.leaves(reloaded.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(ConfigError, match=r"model.path='scratch:tiny' with adapters .*: the adapters in .* have .*; "
                                        r"this run's model.lora asks for .*'target_modules': \['q_proj'\]"):
    load_model("scratch:tiny", mesh, adapters=str(tmp_path), lora=dataclasses.replace(LORA, targets=("q",)))
