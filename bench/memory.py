"""Learner memory: what rematerialisation (`model.remat`), the chunked LM head (`model.logits_chunk`) and LoRA
(`model.lora`) save.

  .venv/bin/python bench/memory.py [--tokens 2600 --smollm-tokens 128 --repeats 2 --lora-rank 64]

(a) The compiler's memory plan (`compiled.memory_analysis()`, nothing allocated: abstract parameters) of the
    learner's gradient, `jax.grad` of a loss over `scoring.token_logp_and_entropy`, at Qwen2.5-3B's shapes
    (bf16 compute, f32 weights), one sequence of `--tokens` tokens (a 5-turn paper episode is ~2,600), for
    remat none / dots / full with the LM head whole or in blocks of 512 tokens, and with LoRA adapters of rank
    `--lora-rank` on every projection (the gradient of the adapters only: the gradient buffer shrinks with them).
(b) The same step run on this machine at SmolLM2-135M's shapes (random weights, one sequence of
    `--smollm-tokens`): temporaries and step time per remat policy and with LoRA, as ratios to `none` in the same
    run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench.common import timed  # noqa: E402
from ragen_jax.models import init_params, lora  # noqa: E402
from ragen_jax.models.model import abstract_params  # noqa: E402
from ragen_jax.models.shapes import shape_config  # noqa: E402
from ragen_jax.scoring import token_logp_and_entropy  # noqa: E402

QWEN25_3B = shape_config("qwen2.5-3b", dtype="bfloat16", param_dtype="float32")
SMOLLM2_135M = shape_config("smollm2-135m")
GIB = 2**30


def loss(config, params, tokens_BT, valid_BT):
  """A learner-like loss: the sampled tokens' log-probs and an entropy bonus."""
  logp, entropy = token_logp_and_entropy(config, params, tokens_BT, valid_BT)
  return jnp.sum(logp) + 0.001 * jnp.sum(entropy)


def lora_loss(config, base, adapters, tokens_BT, valid_BT):
  """`loss` of the adapted model, as a function of the adapters (the base frozen)."""
  return loss(config, lora.combine(base, adapters), tokens_BT, valid_BT)


def learner_step(config):
  """The jitted gradient (of the adapters alone under LoRA) and its leading arguments' split of `params`."""
  if config.lora is None:
    return jax.jit(jax.grad(loss, argnums=1), static_argnums=0), lambda params: (params,)
  return jax.jit(jax.grad(lora_loss, argnums=2), static_argnums=0), lambda params: lora.split(config, params)


def compiled_step(config, params, tokens: int):
  rows = (jax.ShapeDtypeStruct((1, tokens), jnp.int32), jax.ShapeDtypeStruct((1, tokens), bool))
  step, split = learner_step(config)
  return step.lower(config, *split(params), *rows).compile()


def with_lora(config, rank: int):
  return dataclasses.replace(config, lora=lora.LoraConfig(rank=rank, alpha=2.0 * rank))


def size_gib(tree) -> float:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)) / GIB


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--tokens", type=int, default=2600)
  parser.add_argument("--smollm-tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--lora-rank", type=int, default=64)
  args = parser.parse_args()
  print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {jax.devices()[0].platform}")

  print(f"\n(a) Qwen2.5-3B learner gradient, 1 x {args.tokens} tokens, compiler's plan "
        f"(parameters {sum(x.size for x in jax.tree.leaves(abstract_params(QWEN25_3B))) * 4 / GIB:.1f} GiB f32, "
        f"gradients as much)")
  params = abstract_params(QWEN25_3B)
  baseline = None
  for remat in ("none", "dots", "full"):
    for chunk in (0, 512):
      temp = compiled_step(dataclasses.replace(QWEN25_3B, remat=remat, logits_chunk=chunk), params,
                           args.tokens).memory_analysis().temp_size_in_bytes
      baseline = baseline or temp
      print(f"  remat={remat:<4s} LM head {'whole' if not chunk else f'in {chunk}-token blocks':<20s} "
            f"temporaries {temp / GIB:7.2f} GiB = {temp / baseline:5.3f}x none/whole", flush=True)
  config = with_lora(dataclasses.replace(QWEN25_3B, remat="full", logits_chunk=512), args.lora_rank)
  adapters = lora.split(config, abstract_params(config))[1]
  temp = compiled_step(config, abstract_params(config), args.tokens).memory_analysis().temp_size_in_bytes
  print(f"  LoRA r{args.lora_rank} (remat full, 512-token blocks) temporaries {temp / GIB:7.2f} GiB = "
        f"{temp / baseline:5.3f}x none/whole; trained: {size_gib(adapters):.3f} GiB of adapters (gradients and "
        f"each Adam moment as much) instead of {size_gib(params):.1f} GiB of weights", flush=True)

  print(f"\n(b) SmolLM2-135M learner gradient, 1 x {args.smollm_tokens} tokens, run here (best of {args.repeats})")
  params = init_params(SMOLLM2_135M, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (1, args.smollm_tokens), 0, SMOLLM2_135M.vocab_size)
  valid = jnp.ones_like(tokens, bool)
  baseline = None
  variants = [(f"remat={remat}", dataclasses.replace(SMOLLM2_135M, remat=remat)) for remat in ("none", "dots", "full")]
  variants.append((f"LoRA r{args.lora_rank}", with_lora(SMOLLM2_135M, args.lora_rank)))
  for name, config in variants:
    variant_params = params if config.lora is None else init_params(config, jax.random.key(0))
    temp = compiled_step(config, variant_params, args.smollm_tokens).memory_analysis().temp_size_in_bytes
    step, split = learner_step(config)
    inputs = (*split(variant_params), tokens, valid)
    jax.block_until_ready(step(config, *inputs))  # compile
    seconds, _ = timed(lambda: step(config, *inputs), repeats=args.repeats)
    baseline = baseline or (temp, seconds)
    print(f"  {name:<10s} temporaries {temp / 2**20:8.1f} MiB = {temp / baseline[0]:5.3f}x none; "
          f"step {seconds:6.2f} s = {seconds / baseline[1]:5.2f}x none", flush=True)


if __name__ == "__main__":
  main()
