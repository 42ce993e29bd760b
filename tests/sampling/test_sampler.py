"""Sampler: greedy parity with transformers' generate, cache continuation, sampling rules, stops."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ragen_jax import mesh as mesh_lib
from ragen_jax.models import forward_logits, load_pretrained
from ragen_jax.sampling import (CacheOverflowError, SamplingRule, SamplingSession, generate, sample,
                                sampling_logits)
from tests.models.hf_fixtures import save_hf_model

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [42]]


def _hf_greedy(hf_model, prompt, n, **kwargs):
  ids = torch.tensor([prompt])
  out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, **kwargs)
  return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=["llama_untied", "qwen2_bias", "qwen3_untied"])
def tiny(request, tmp_path_factory):
  path = tmp_path_factory.mktemp(request.param)
  hf_model = save_hf_model(request.param, path, initializer_range=0.3)
  hf_model.generation_config.eos_token_id = None
  hf_model.generation_config.pad_token_id = 0
  return hf_model, load_pretrained(path)


def test_greedy_matches_transformers_generate(tiny):
  hf_model, model = tiny
  ours = generate(model, PROMPTS, max_new_tokens=10)
  assert ours == [_hf_greedy(hf_model, p, 10) for p in PROMPTS]


def test_greedy_on_bundled_smollm2_matches_transformers(smollm2_dir):
  import transformers
  tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()
  model = load_pretrained(smollm2_dir)
  texts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]
  prompts = [tokenizer.encode(t) for t in texts]
  ours = generate(model, prompts, max_new_tokens=6)
  hf_model.generation_config.pad_token_id = tokenizer.eos_token_id
  assert ours == [_hf_greedy(hf_model, p, 6) for p in prompts]
  assert tokenizer.decode(ours[0]).startswith(" Paris")


def test_cache_continuation_equals_full_prefill_over_three_turns(tiny):
  _, model = tiny
  rng = np.random.default_rng(0)
  rows = [list(p) for p in PROMPTS]
  session = SamplingSession.start(model, rows, max_len=96)
  for turn in range(3):
    gen = session.generate(6, SamplingRule(temperature=1.0), key=jax.random.key(turn))
    tokens, lengths = np.asarray(gen.tokens_BN), np.asarray(gen.lengths_B)
    observations = [rng.integers(1, 100, rng.integers(1, 6)).tolist() for _ in rows]
    for i, row in enumerate(rows):
      row += tokens[i, :lengths[i]].tolist() + observations[i]
    session.append(observations)
    # The cached next-token logits equal a fresh prefill of each whole history.
    width = max(len(r) for r in rows)
    packed = np.zeros((len(rows), width), np.int32)
    valid = np.zeros((len(rows), width), bool)
    for i, row in enumerate(rows):
      packed[i, width - len(row):], valid[i, width - len(row):] = row, True
    fresh = np.asarray(forward_logits(model.config, model.params, jnp.asarray(packed), jnp.asarray(valid)))
    # float32 summation order differs (holes vs packed rows): compare relative to the logits' scale.
    cached = np.asarray(session.state.logits_BV)
    assert np.max(np.abs(cached - fresh[:, -1])) <= 1e-5 * np.max(np.abs(fresh[:, -1]))


def test_unrolled_and_scanned_decode_layers_sample_the_same_turns(tiny):
  """`decode_layers` "unrolled" against "scan" (the default): same tokens, log-probs and cache over two turns."""
  _, model = tiny
  unrolled = dataclasses.replace(model, config=dataclasses.replace(model.config, decode_layers="unrolled"))
  assert model.config.decode_layers == "scan"
  outputs = []
  for m in (unrolled, model):
    session = SamplingSession.start(m, PROMPTS, max_len=64)
    first = session.generate(6, SamplingRule(temperature=1.0), key=jax.random.key(0))
    session.append([[5, 6]] * len(PROMPTS))
    second = session.generate(6, SamplingRule(temperature=1.0), key=jax.random.key(1))
    outputs.append(((first, second), session.state))
  (gens, state), (gens_scan, state_scan) = outputs
  for gen, gen_scan in zip(gens, gens_scan):
    np.testing.assert_array_equal(gen.tokens_BN, gen_scan.tokens_BN)
    np.testing.assert_allclose(gen.model_logp_BN, gen_scan.model_logp_BN, atol=1e-5)
  np.testing.assert_allclose(state.cache.k, state_scan.cache.k, atol=1e-5)
  np.testing.assert_allclose(state.logits_BV, state_scan.logits_BV, atol=1e-4)


def test_model_logp_is_the_unmodified_model_distribution(tiny):
  _, model = tiny
  session = SamplingSession.start(model, PROMPTS, max_len=64)
  gen = session.generate(5, SamplingRule(temperature=0.7, top_k=5), key=jax.random.key(3))
  row = 2
  history = PROMPTS[row] + np.asarray(gen.tokens_BN)[row].tolist()
  logits = np.asarray(model.logits(np.asarray([history])))[0]
  logp = jax.nn.log_softmax(logits, -1)
  start = len(PROMPTS[row]) - 1
  expected = [logp[start + t, history[start + t + 1]] for t in range(5)]
  np.testing.assert_allclose(np.asarray(gen.model_logp_BN)[row], expected, atol=1e-4)
  truncated = jax.nn.log_softmax(sampling_logits(jnp.asarray(logits[start:start + 5]), gen_rule := SamplingRule(
      temperature=0.7, top_k=5)), -1)
  del gen_rule
  np.testing.assert_allclose(np.asarray(gen.sampling_logp_BN)[row],
                             [truncated[t, history[start + t + 1]] for t in range(5)], atol=1e-4)


def _reference_distribution(logits, temperature, top_k, top_p):
  """Independent float64 numpy version of temperature → top-k → top-p."""
  z = np.asarray(logits, np.float64) / temperature
  p = np.exp(z - z.max())
  p /= p.sum()
  keep = np.ones_like(p, bool)
  order = np.argsort(-p, kind="stable")
  if top_k:
    keep[order[top_k:]] = False
  p = np.where(keep, p, 0.0)
  p /= p.sum()
  if top_p < 1.0:
    cumulative, keep = 0.0, np.zeros_like(keep)
    for idx in np.argsort(-p, kind="stable"):
      if cumulative >= top_p or p[idx] == 0:
        break
      keep[idx] = True
      cumulative += p[idx]
    p = np.where(keep, p, 0.0)
    p /= p.sum()
  return p


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0),
                                                     (1.0, 3, 1.0), (1.0, 0, 0.6), (0.8, 4, 0.7)])
def test_sampling_rule_distribution(temperature, top_k, top_p):
  logits = jnp.asarray([[2.0, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -3.0]])
  expected = _reference_distribution(logits[0], temperature, top_k, top_p)
  draws = 40_000
  tokens, _, _ = jax.jit(lambda k: sample(k, jnp.repeat(logits, draws, 0), SamplingRule(temperature, top_k, top_p)))(
      jax.random.key(0))
  empirical = np.bincount(np.asarray(tokens), minlength=8) / draws
  assert np.all(empirical[expected == 0] == 0)
  # Total variation: ~0.01 for the right distribution at this sample size; a wrong rule is off by > 0.05.
  assert 0.5 * np.abs(empirical - expected).sum() < 0.02


@pytest.mark.parametrize("top_k", [0, 5])
def test_sampling_draws_across_vocabulary_blocks(top_k):
  """700 entries: three blocks of the two-level draw (the last one padded), mass at the blocks' edges, a light
  tail, and with top-k masked entries in every block (never drawn)."""
  logits = np.full(700, -9.0, np.float32)
  logits[[0, 255, 256, 511, 512, 600, 699]] = [1.0, 2.0, 1.5, 0.5, 2.5, 0.0, 1.0]
  expected = _reference_distribution(jnp.asarray(logits), 1.0, top_k, 1.0)
  draws = 40_000
  tokens, sampling_logp, model_logp = jax.jit(lambda k: sample(k, jnp.tile(logits, (draws, 1)), SamplingRule(
      1.0, top_k)))(jax.random.key(1))
  empirical = np.bincount(np.asarray(tokens), minlength=700) / draws
  assert np.all(empirical[expected == 0] == 0)
  assert 0.5 * np.abs(empirical - expected).sum() < 0.02
  np.testing.assert_allclose(sampling_logp, np.log(expected[np.asarray(tokens)]), rtol=1e-5)
  np.testing.assert_allclose(model_logp, jax.nn.log_softmax(logits)[np.asarray(tokens)], rtol=1e-5)


def test_greedy_rule_is_argmax_with_zero_sampling_logp():
  logits = jnp.asarray([[0.1, 3.0, -1.0], [5.0, 0.0, 4.9]])
  tokens, slp, mlp = sample(jax.random.key(0), logits, SamplingRule(temperature=0.0))
  assert tokens.tolist() == [1, 0]
  np.testing.assert_allclose(slp, 0.0)
  np.testing.assert_allclose(mlp, jax.nn.log_softmax(logits, -1)[jnp.arange(2), tokens], rtol=1e-6)


def _first_new(seq, width, start):
  """First window of `width` tokens at index >= start that does not occur earlier in `seq`."""
  for k in range(start, len(seq) - width + 1):
    window = seq[k:k + width]
    if all(seq[j:j + width] != window for j in range(k)):
      return window
  raise AssertionError(f"no fresh window in {seq}")


def _cut(seq, budget, eos, stops):
  """Reference stopping rule on a free-running greedy continuation."""
  out = []
  for token in seq[:budget]:
    if token == eos:
      return out
    out.append(token)
    if any(out[-len(s):] == s for s in stops if len(out) >= len(s)):
      return out
  return out


def test_stop_sequences_eos_and_budgets(tiny):
  hf_model, model = tiny
  free = [_hf_greedy(hf_model, p, 12) for p in PROMPTS]
  # Row 0 meets a two-token stop sequence from its own continuation (split across tokens),
  # row 1 an EOS id; the others run to their own budgets unless they meet either.
  stop = _first_new(free[0], 2, 3)
  (eos,) = _first_new(free[1], 1, 4)
  stops = [stop, [127, 126, 125]]
  config = dataclasses.replace(model.config, eos_token_ids=(eos,))
  model_with_eos = dataclasses.replace(model, config=config)
  budgets = [12, 12, 9, 4]
  ours = generate(model_with_eos, PROMPTS, max_new_tokens=budgets, stop_sequences=stops)
  expected = [_cut(f, b, eos, stops) for f, b in zip(free, budgets)]
  assert ours == expected
  assert ours[0][-2:] == stop and len(ours[1]) < 12 and len(ours[3]) <= 4


def test_greedy_tokens_same_on_eight_devices(tmp_path):
  save_hf_model("qwen2_bias", tmp_path, initializer_range=0.3)
  prompts = PROMPTS * 2
  single = generate(load_pretrained(tmp_path), prompts, max_new_tokens=8)
  for shape, decode_layers in (((8, 1, 1), "scan"), ((2, 2, 2), "scan"), ((1, 4, 2), "scan"),
                                ((2, 2, 2), "unrolled")):
    sharded = load_pretrained(tmp_path, mesh=mesh_lib.make_mesh(*shape), decode_layers=decode_layers)
    assert generate(sharded, prompts, max_new_tokens=8) == single, (shape, decode_layers)


def test_cache_overflow_fails_clearly(tiny):
  _, model = tiny
  session = SamplingSession.start(model, PROMPTS, max_len=24)
  session.generate(8)
  with pytest.raises(CacheOverflowError, match="free slots"):
    session.generate(8)
  with pytest.raises(CacheOverflowError, match="prompts need"):
    SamplingSession.start(model, [[1] * 30], max_len=16)


def test_bad_sampling_settings_fail_early():
  with pytest.raises(ValueError, match="top_p"):
    SamplingRule(top_p=0.0)
  with pytest.raises(ValueError, match="temperature"):
    SamplingRule(temperature=-1.0)
  with pytest.raises(TypeError, match="token-id"):
    from ragen_jax.sampling import stop_sequence_array
    stop_sequence_array(["</answer>"])
