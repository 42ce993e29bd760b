"""Decode throughput: our jitted sampler vs transformers' PyTorch `generate` on SmolLM2-135M.

  .venv/bin/python bench/sampler.py [--batches 16,64] [--new-tokens 128] [--lora-rank 64]
      [--dtype bfloat16 --random-weights]  # what bench/gpu.sh runs

Both sides decode exactly `new-tokens` tokens per row (EOS disabled) from the same
weights and chat prompts, against this machine's decode roofline (`bench/limits.py`): per step the larger of
reading the weights and the KV cache at the mean context over the measured bandwidth, and the step's FLOPs
(2 per parameter per row, attention over the cache included) over the matmul peak of the compute dtype.
`--random-weights`: SmolLM2-135M's shapes with random weights and 32 random prompt tokens per row (no tokenizer,
no checkpoint and no transformers peer: what a machine without the bundled model runs).
With LoRA adapters (rank `--lora-rank` on every projection), the sampler either applies them in the forward or
decodes with the weights merged first (`models.lora.merge`, counted once per batch as a training iteration would):
both as tok/s against the plain model in the same run.
Our decode scans the stacked layers (`model.decode_layers` "scan", the default); it is also timed with the layers
unrolled over weights sliced once per decode ("unrolled"). Each batch's decode step is split into attention over
the cache, the LM head, sampling and the rest, and one decode of `--profile-tokens` tokens is profiled op by op
(`bench/profiling.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.common import report, timed  # noqa: E402
from bench.limits import measure  # noqa: E402
from bench.profiling import op_profile, print_profile  # noqa: E402
from ragen_jax.mesh import single_device_mesh  # noqa: E402
from ragen_jax.models import Model, bundled_model_dir, init_params, load_pretrained, lora  # noqa: E402
from ragen_jax.models.model import adapter_params  # noqa: E402
from ragen_jax.models.shapes import shape_config  # noqa: E402
from ragen_jax.sampling import SamplingRule, SamplingSession, decode  # noqa: E402
from ragen_jax.sampling.session import round_up  # noqa: E402


def chat_prompts(tokenizer, batch: int) -> list[list[int]]:
  questions = [f"Give me {i + 1} reasons to learn about {topic}." for i, topic in
               zip(range(batch), ["rivers", "stars", "music", "code", "bread", "chess", "trees", "maths"] * batch)]
  out = []
  for q in questions:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True)
    out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
  return out


def ours_tokens_per_second(model, prompts, new_tokens: int) -> float:
  max_len = round_up(max(map(len, prompts)), 8) + new_tokens

  def run():
    session = SamplingSession.start(model, prompts, max_len)
    return session.generate(new_tokens, SamplingRule(temperature=1.0), key=jax.random.key(0)).tokens_BN

  run()  # compile
  seconds, tokens = timed(run, repeats=2)
  assert np.asarray(tokens).shape == (len(prompts), new_tokens)
  return len(prompts) * new_tokens / seconds


def lora_tokens_per_second(model, prompts, new_tokens: int, rank: int) -> tuple[float, float]:
  """(tok/s with the adapters applied in the forward, tok/s with the weights merged first, the merge included)."""
  config = dataclasses.replace(model.config, lora=lora.LoraConfig(rank=rank, alpha=2.0 * rank))
  adapters = jax.tree.map(lambda x: x + 0.01, adapter_params(config, model.mesh))  # b != 0: a trained adapter
  adapted = Model(config, lora.combine(model.params, adapters), model.mesh)
  in_forward = ours_tokens_per_second(adapted, prompts, new_tokens)
  merge = jax.jit(functools.partial(lora.merge, config))
  jax.block_until_ready(merge(adapted.params))  # compile
  merge_seconds, merged = timed(lambda: merge(adapted.params), repeats=2)
  merged_rate = ours_tokens_per_second(Model(lora.without(config), merged, model.mesh), prompts, new_tokens)
  tokens = len(prompts) * new_tokens
  return in_forward, tokens / (merge_seconds + tokens / merged_rate)


def hf_tokens_per_second(hf_model, prompts, new_tokens: int, pad_id: int) -> float:
  import torch
  width = max(map(len, prompts))
  ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
  mask = torch.zeros_like(ids)
  for i, p in enumerate(prompts):
    ids[i, width - len(p):] = torch.tensor(p)
    mask[i, width - len(p):] = 1
  kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                top_k=0, top_p=1.0, temperature=1.0, pad_token_id=pad_id)
  with torch.inference_mode():
    hf_model.generate(ids[:, :], **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
    seconds, _ = timed(lambda: hf_model.generate(ids, **kwargs))
  return len(prompts) * new_tokens / seconds


def decode_roofline(config, n_params: int, limits, batch: int, context: float) -> tuple[float, str]:
  """(tok/s, what binds) of decode at `batch` rows with `context` cached tokens each: a step reads the weights
  once (in their dtype) and every row's K and V (in the compute dtype, as the cache holds them), and does 2 FLOPs
  per parameter and 4 per head dimension per cached token a row."""
  weight_bytes = np.dtype(config.weight_dtype).itemsize * n_params
  kv_bytes = (batch * context * config.num_layers * 2 * config.num_kv_heads * config.head_dim
              * np.dtype(config.compute_dtype).itemsize)
  attention_flops = batch * context * config.num_layers * 4 * config.num_heads * config.head_dim
  seconds, bound = limits.decode_step(weight_bytes + kv_bytes, 2 * n_params * batch + attention_flops, config.dtype)
  return batch / seconds, bound


def attention_seconds(config, batch: int, context: int) -> float:
  """Seconds of one decode step's attention over the cache in every layer: `transformer.cached_attention` of one
  query per row over `context` filled slots of a cache of `context` + 128, timed for one layer, times the layers."""
  from ragen_jax.models.transformer import KVCache, cached_attention

  slots = context + 128
  cache = KVCache.zeros(config, batch, slots)
  cache = cache.replace(k=jax.random.normal(jax.random.key(0), cache.k.shape, cache.k.dtype),
                        v=jax.random.normal(jax.random.key(1), cache.v.shape, cache.v.dtype))
  q_BTNH = jax.random.normal(jax.random.key(2), (batch, 1, config.num_heads, config.head_dim), cache.k.dtype)
  mask_BTS = jnp.broadcast_to(jnp.arange(slots) < context, (batch, 1, slots))
  one_layer = jax.jit(lambda q, k, v, mask: cached_attention(q, k, v, 0, mask, jnp.int32(context)))
  jax.block_until_ready(one_layer(q_BTNH, cache.k, cache.v, mask_BTS))
  seconds, _ = timed(one_layer, q_BTNH, cache.k, cache.v, mask_BTS, repeats=5)
  return seconds * config.num_layers


def step_parts(model, batch: int, ours_tok_s: float, context: int) -> None:
  """Where a decode step's time goes, against the whole step (1 / tokens per second per row): attention over a
  cache of `context` tokens in every layer, the LM head's matmul [batch, hidden] x [hidden, vocab] and drawing one
  token per row from [batch, vocab] logits (`sampling.rules.sample` at temperature 1, which also takes both
  log-probabilities); the rest is the layers' projections, MLPs and norms."""
  from ragen_jax.sampling.rules import sample

  config = model.config
  embed = model.params["embed_tokens"]["embedding"] if config.tie_word_embeddings else None
  head_DV = embed.T if embed is not None else model.params["lm_head"]["kernel"]
  hidden_BD = jax.random.normal(jax.random.key(0), (batch, config.hidden_size), head_DV.dtype)
  logits_BV = jax.random.normal(jax.random.key(1), (batch, config.vocab_size), jnp.float32)
  head = jax.jit(jnp.matmul)
  draw = jax.jit(lambda key, logits: sample(key, logits, SamplingRule(temperature=1.0)))
  jax.block_until_ready((head(hidden_BD, head_DV), draw(jax.random.key(2), logits_BV)))
  head_s, _ = timed(head, hidden_BD, head_DV, repeats=5)
  draw_s, _ = timed(draw, jax.random.key(2), logits_BV, repeats=5)
  attention_s = attention_seconds(config, batch, context)
  step_s = batch / ours_tok_s
  rest_s = step_s - head_s - draw_s - attention_s
  print(f"  batch {batch}: decode step {1e3 * step_s:.2f} ms; attention over {context} cached tokens "
        f"{1e3 * attention_s:.2f} ms ({attention_s / step_s:.0%}); LM head matmul {1e3 * head_s:.2f} ms "
        f"({head_s / step_s:.0%}); sampling over {config.vocab_size} {1e3 * draw_s:.2f} ms ({draw_s / step_s:.0%}, "
        f"{draw_s / head_s:.2f}x the LM head); the rest of the layers {1e3 * rest_s:.2f} ms ({rest_s / step_s:.0%})",
        flush=True)


def decode_profile(model, prompts, new_tokens: int) -> None:
  """The op profile (`bench/profiling.py`) of one call of our decode loop, `new_tokens` tokens per row."""
  max_len = round_up(max(map(len, prompts)), 8) + new_tokens
  key = jax.random.key(0)
  with jax.set_mesh(model.mesh):
    start = lambda: SamplingSession.start(model, prompts, max_len).state  # noqa: E731
    compiled = decode.lower(model.config, model.params, start(), key, rule=SamplingRule(temperature=1.0),
                            max_new_tokens=new_tokens).compile()
    ops = op_profile(compiled, [(model.params, start(), key)])
  print_profile(f"decode of {new_tokens} tokens, batch {len(prompts)}", ops)


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--batches", default="16,64")
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--skip-hf", action="store_true")
  parser.add_argument("--lora-rank", type=int, default=64)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--random-weights", action="store_true")
  parser.add_argument("--profile-tokens", type=int, default=32, help="profile a decode of this many tokens (0: none)")
  args = parser.parse_args()

  if args.random_weights:
    config = shape_config("smollm2-135m", dtype=args.dtype)
    model, tokenizer, hf_model = Model(config, init_params(config, jax.random.key(0)), single_device_mesh()), None, None
  else:
    import torch
    import transformers
    torch.set_num_threads(os.cpu_count())
    path = bundled_model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = load_pretrained(path, dtype=args.dtype)
    hf_model = None if args.skip_hf else transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  model = dataclasses.replace(model, config=dataclasses.replace(model.config, eos_token_ids=()))
  n_params = sum(x.size for x in jax.tree.leaves(model.params))
  print(f"SmolLM2-135M ({n_params / 1e6:.1f}M params, {args.dtype}{', random weights' * args.random_weights}), "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s), {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}")
  limits = measure()
  for batch in map(int, args.batches.split(",")):
    if tokenizer is None:
      prompts = np.random.default_rng(batch).integers(2, model.config.vocab_size, (batch, 32)).tolist()
    else:
      prompts = chat_prompts(tokenizer, batch)
    context = sum(map(len, prompts)) / batch + args.new_tokens / 2
    roofline, bound = decode_roofline(model.config, n_params, limits, batch, context)
    report(f"decode roofline, batch {batch} ({bound}-bound)", roofline, "tok/s")
    ours = ours_tokens_per_second(model, prompts, args.new_tokens)
    unrolled = dataclasses.replace(model, config=dataclasses.replace(model.config, decode_layers="unrolled"))
    report(f"ragen_jax sampler, batch {batch}, layers unrolled", ours_tokens_per_second(unrolled, prompts,
           args.new_tokens), "tok/s", "scanned (the default)", ours)
    if hf_model is not None:
      hf = hf_tokens_per_second(hf_model, prompts, args.new_tokens, tokenizer.pad_token_id or 0)
      report(f"transformers generate, batch {batch}", hf, "tok/s")
      report(f"ragen_jax sampler, batch {batch}", ours, "tok/s", "transformers generate", hf)
    report(f"ragen_jax sampler, batch {batch} vs roofline", ours, "tok/s", "roofline", roofline)
    step_parts(model, batch, ours, int(context))
    if args.profile_tokens:
      decode_profile(model, prompts, args.profile_tokens)
    if args.lora_rank:
      in_forward, merged = lora_tokens_per_second(model, prompts, args.new_tokens, args.lora_rank)
      report(f"LoRA r{args.lora_rank} in the forward, batch {batch}", in_forward, "tok/s", "no LoRA", ours)
      report(f"LoRA r{args.lora_rank} merged first, batch {batch}", merged, "tok/s", "no LoRA", ours)


if __name__ == "__main__":
  main()
