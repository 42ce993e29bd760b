"""Teacher-forced log-probs, entropies and their gradients against transformers' PyTorch models;
masked reductions against float64 numpy."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ragen_jax import mesh as mesh_lib
from ragen_jax.models import ModelConfig, init_params, load_pretrained
from ragen_jax.scoring import masked_whiten, token_entropy, token_logp_and_entropy
from ragen_jax.sft import sft_loss
from tests.models.hf_fixtures import save_hf_model
from tests.rl.test_advantages import reference_whiten


def _tokens_and_masks(vocab, batch=3, length=19):
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, vocab, (batch, length)).astype(np.int32)
  valid = np.ones_like(tokens, bool)
  valid[1, :4] = False  # a left-padded row
  loss_mask = valid & (rng.random(tokens.shape) < 0.6)
  loss_mask[:, 0] = False
  loss_mask[:, 1:] &= valid[:, :-1]  # each scored token predicted from a real one
  return tokens, valid, loss_mask


@pytest.mark.parametrize("variant", ["llama_tied_mha", "qwen2_bias", "qwen3_untied"])
def test_logp_entropy_and_loss_gradient_match_torch(variant, tmp_path):
  hf_model = save_hf_model(variant, tmp_path)
  model = load_pretrained(tmp_path)
  tokens, valid, loss_mask = _tokens_and_masks(model.config.vocab_size)

  logp, entropy = token_logp_and_entropy(model.config, model.params, tokens, valid)
  logits = hf_model(torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(valid.astype(np.int64))).logits
  ref_logp_all = torch.log_softmax(logits, -1)
  ref_logp = ref_logp_all[:, :-1].gather(-1, torch.tensor(tokens[:, 1:, None], dtype=torch.long))[..., 0]
  ref_entropy = -(ref_logp_all.exp() * ref_logp_all).sum(-1)[:, :-1]
  rows = valid[:, :-1]  # predictions made from a real token
  np.testing.assert_allclose(np.asarray(logp)[:, 1:][rows], ref_logp.detach().numpy()[rows], atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(entropy)[:, 1:][rows], ref_entropy.detach().numpy()[rows], atol=2e-5,
                             rtol=1e-5)
  assert np.all(np.asarray(logp)[:, 0] == 0) and np.all(np.asarray(entropy)[:, 0] == 0)

  # The gradient of the masked mean NLL (the SFT loss) with respect to two weights.
  grads = jax.grad(sft_loss, argnums=1)(model.config, model.params, tokens, valid, loss_mask)
  mask = torch.tensor(loss_mask[:, 1:])
  (-(ref_logp * mask).sum() / mask.sum()).backward()
  gate_ref = hf_model.model.layers[1].mlp.gate_proj.weight.grad.numpy().T
  np.testing.assert_allclose(np.asarray(grads["layers"]["gate_proj"]["kernel"][1]), gate_ref, atol=1e-6, rtol=1e-4)
  embed_ref = hf_model.model.embed_tokens.weight.grad.numpy()
  np.testing.assert_allclose(np.asarray(grads["embed_tokens"]["embedding"]), embed_ref, atol=1e-6, rtol=1e-4)


def test_token_entropy_matches_torch():
  logits = np.random.default_rng(1).normal(size=(2, 3, 11)).astype(np.float32) * 3
  want = torch.distributions.Categorical(logits=torch.from_numpy(logits)).entropy().numpy()
  np.testing.assert_allclose(np.asarray(token_entropy(jnp.asarray(logits))), want, rtol=1e-5, atol=1e-6)


def entropy_float64(logits):
  logits = np.asarray(logits, np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  return -(np.exp(logp) * logp).sum(-1)


def test_token_entropy_of_equal_large_logits_is_log_v():
  # uncentred, exp(x - logsumexp) loses digits at this magnitude (it gave 5.71741)
  got = float(token_entropy(jnp.full((1, 1, 300), 1000.0))[0, 0])
  np.testing.assert_allclose(got, np.log(300), rtol=1e-6)


@pytest.mark.parametrize("offset,scale", [(1000.0, 3.0), (-1000.0, 3.0), (3e4, 0.5), (0.0, 1e-4), (0.0, 30.0)])
def test_token_entropy_matches_float64_for_large_and_small_logits(offset, scale):
  logits = (offset + scale * np.random.default_rng(2).normal(size=(3, 4, 257))).astype(np.float32)
  got = np.asarray(token_entropy(jnp.asarray(logits)))
  np.testing.assert_allclose(got, entropy_float64(logits), rtol=2e-6, atol=2e-6)


def test_masked_whiten_ignores_unmasked_values():
  rng = np.random.default_rng(3)
  x = rng.normal(size=(4, 9))
  mask = rng.random((4, 9)) < 0.6
  x_with_junk = np.where(mask, x, np.nan)
  got = masked_whiten(jnp.asarray(x_with_junk, jnp.float32), jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(got), reference_whiten(x, mask), rtol=1e-5, atol=1e-5)



SCORING_CONFIG = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
                             num_kv_heads=2, head_dim=16, tie_word_embeddings=False)


def _scored_loss(config, params, tokens, valid, loss_mask):
  """A loss over log-probs and entropies, as the learner's is."""
  logp, entropy = token_logp_and_entropy(config, params, tokens, valid)
  return jnp.sum(jnp.where(loss_mask, logp + 0.1 * entropy, 0.0))


def _loss_and_grads(config, mesh=None):
  """(loss, grads) of `_scored_loss` on 4 rows of 19 tokens (a ragged last block for chunks of 5 or 7), params and
  rows placed on `mesh` (default one device)."""
  mesh = mesh or mesh_lib.single_device_mesh()
  params = init_params(config, jax.random.key(0), mesh)
  tokens, valid, loss_mask = (np.concatenate([x, x[:1]]) for x in _tokens_and_masks(config.vocab_size))
  with jax.set_mesh(mesh):
    rows = [jax.device_put(x, mesh_lib.batch_sharding(mesh, 2)) for x in (tokens, valid, loss_mask)]
    loss, grads = jax.jit(jax.value_and_grad(_scored_loss, argnums=1), static_argnums=0)(config, params, *rows)
  return float(loss), mesh_lib.fetch(grads)


def _assert_grads_close(grads, ref_grads, rtol=1e-6):
  for (path, g), ref in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(ref_grads)):
    assert np.max(np.abs(g - ref)) <= rtol * np.max(np.abs(ref)), jax.tree_util.keystr(path)


@pytest.mark.parametrize("remat,chunk", [("full", 0), ("dots", 0), ("none", 5), ("full", 5), ("dots", 7)])
def test_remat_and_chunked_lm_head_keep_values_and_gradients(remat, chunk):
  ref_loss, ref_grads = _loss_and_grads(SCORING_CONFIG)
  loss, grads = _loss_and_grads(dataclasses.replace(SCORING_CONFIG, remat=remat, logits_chunk=chunk))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  _assert_grads_close(grads, ref_grads)


def test_remat_and_chunks_on_eight_devices_equal_one_device():
  assert jax.device_count() == 8
  config = dataclasses.replace(SCORING_CONFIG, remat="full", logits_chunk=5)
  ref_loss, ref_grads = _loss_and_grads(SCORING_CONFIG)
  loss, grads = _loss_and_grads(config, mesh_lib.make_mesh(data=2, fsdp=2, tensor=2))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  _assert_grads_close(grads, ref_grads, rtol=1e-5)


def test_remat_and_chunks_cut_the_compiled_temporaries():
  """The compiler's own memory plan of the learner's gradient (one 256-token row, vocab 4096)."""
  config = dataclasses.replace(SCORING_CONFIG, vocab_size=4096, num_layers=4)
  params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  rows = (jax.ShapeDtypeStruct((1, 256), jnp.int32), jax.ShapeDtypeStruct((1, 256), bool),
          jax.ShapeDtypeStruct((1, 256), bool))

  def temporaries(remat, chunk):
    step = jax.jit(jax.grad(_scored_loss, argnums=1), static_argnums=0)
    compiled = step.lower(dataclasses.replace(config, remat=remat, logits_chunk=chunk), params, *rows).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  none, full, chunked, both = temporaries("none", 0), temporaries("full", 0), temporaries("none", 64), \
      temporaries("full", 64)
  assert full < 0.8 * none and chunked < 0.8 * none and both < 0.35 * none, (none, full, chunked, both)
