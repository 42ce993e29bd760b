"""Decode throughput: our jitted sampler vs tunix's `Sampler` (google-tunix 0.1.7) on SmolLM2-135M, float32.

  make install-tunix && PYTHONPATH=. .venv-tunix/bin/python bench/tunix_sampler.py [--batches 1,16,64]

A bench-only peer that runs from its own venv, .venv-tunix (`make bench` makes it; bench/run_all.py runs this file
with it): google-tunix 0.1.7 requires safetensors<0.8 while our transformers==5.24.0 requires safetensors>=0.8, so
it cannot share .venv. That venv has all our pins but safetensors 0.7.0, transformers 5.12.1 and tokenizers 0.22.2
(bench/requirements-tunix.txt); jax 0.10.2 and flax 0.12.8 are ours.

Same protocol as bench/sampler.py: its chat prompts (`chat_prompts`), `new-tokens` tokens per row with EOS disabled
(tunix: an EOS id no token has), tok/s = batch * new tokens / best seconds of 2 calls after a warm-up (compile) call,
both sampling at temperature 1 over the full vocabulary (`ours_tokens_per_second`; tunix: top_p 1). Tunix gets our
token ids (no re-tokenization), left-padded to our prompt width (a multiple of 8), a KV cache of that width plus
`new-tokens`, and returns text as well (its decode of the rows is in its time). Both run in this process. Ours
runs twice: scanning the stacked layers (the default) and unrolled over per-layer weights (`model.decode_layers`).

Tunix's llama3 has no llama-3.1 rope scaling (SmolLM2 has none either), but its attention calls `apply_rope` without
the config's rope_theta, so it rotates at its default theta 1e6 instead of SmolLM2's 1e5: the model is built with
`apply_rope` bound to the config's theta (`--tunix-rope-as-shipped` leaves it as shipped). The weights check: greedy
tokens of both samplers for the first prompt at batch 1 agree for the first `--check-tokens` new tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.common import report, timed  # noqa: E402
from bench.sampler import chat_prompts, ours_tokens_per_second  # noqa: E402
from ragen_jax.models import bundled_model_dir, load_pretrained  # noqa: E402
from ragen_jax.sampling import SamplingRule, SamplingSession  # noqa: E402
from ragen_jax.sampling.session import round_up  # noqa: E402

REPEATS = 2  # as `ours_tokens_per_second`
NO_EOS = -1  # an id no token has: tunix's eos_tokens falls back to the tokenizer's EOS when empty


class PromptIds:
  """A tokenizer for tunix's `Sampler` whose texts are indices into prompts already tokenized: tunix starts from the
  same ids as ours (no BOS added, pad id 0, which the prompts lack), and decodes with the model's tokenizer."""

  def __init__(self, prompts: list[list[int]], tokenizer):
    self.prompts, self.tokenizer = prompts, tokenizer

  def texts(self) -> list[str]:
    """The inputs to pass to the sampler for all the prompts."""
    return [str(i) for i in range(len(self.prompts))]

  def encode(self, text: str, **_) -> list[int]:
    return list(self.prompts[int(text)])

  def decode(self, ids, **kwargs) -> str:
    return self.tokenizer.decode(ids, **kwargs)

  def bos_id(self):
    return None

  def eos_id(self) -> int:
    return self.tokenizer.eos_token_id

  def pad_id(self) -> int:
    return 0


def tunix_model(path: str, rope_as_shipped: bool = False):
  """(tunix config, tunix Llama3) for the Hugging Face Llama checkpoint at `path` (config.json), in float32, by tunix's
  own safetensors loader (`llama3.params.create_model_from_safe_tensors`)."""
  from tunix.models.llama3 import model as llama
  from tunix.models.llama3 import params

  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  assert not hf.get("rope_scaling"), "tunix's llama3 has no rope scaling"
  config = llama.ModelConfig(
    num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
    hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
    head_dim=hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"]),
    num_kv_heads=hf["num_key_value_heads"], rope_theta=int(hf["rope_theta"]), norm_eps=hf["rms_norm_eps"],
    weight_tying=hf.get("tie_word_embeddings", False))
  if not rope_as_shipped:
    shipped = getattr(llama.apply_rope, "func", llama.apply_rope)
    llama.apply_rope = functools.partial(shipped, rope_theta=config.rope_theta)
  return config, params.create_model_from_safe_tensors(str(path), config, dtype=jnp.float32)


def tunix_sampler(config, model, cache_size: int, ids: PromptIds):
  """Tunix's `Sampler` over `model` with a KV cache of `cache_size` slots."""
  from tunix.generate.sampler import CacheConfig, Sampler

  cache = CacheConfig(cache_size=cache_size, num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
                      head_dim=config.head_dim)
  return Sampler(model, ids, cache)


def tunix_generate(config, model, prompts, tokenizer, new_tokens: int, greedy: bool):
  """A no-argument function that runs tunix's sampler over `prompts` for `new_tokens` tokens (EOS disabled) and
  returns the new tokens [batch, new_tokens]; greedy or at temperature 1 over the full vocabulary."""
  ids = PromptIds(prompts, tokenizer)
  width = round_up(max(map(len, prompts)), 8)
  sampler = tunix_sampler(config, model, width + new_tokens, ids)
  rule = dict(temperature=0.0) if greedy else dict(temperature=1.0, top_p=1.0, top_k=None, seed=0)

  def run():
    out = sampler(ids.texts(), max_generation_steps=new_tokens, max_prompt_length=width, eos_tokens=[NO_EOS],
                  **rule)
    return np.stack([np.asarray(t) for t in out.tokens])

  return run


def tunix_tokens_per_second(config, model, prompts, tokenizer, new_tokens: int) -> float:
  """Tunix's tok/s at temperature 1: batch * new tokens over the best of `REPEATS` calls after a warm-up call."""
  run = tunix_generate(config, model, prompts, tokenizer, new_tokens, greedy=False)
  run()  # compile
  seconds, tokens = timed(run, repeats=REPEATS)
  assert tokens.shape == (len(prompts), new_tokens), tokens.shape
  return len(prompts) * new_tokens / seconds


def ours_greedy(model, prompt: list[int], new_tokens: int) -> np.ndarray:
  """Our sampler's greedy new tokens [new_tokens] for one prompt."""
  session = SamplingSession.start(model, [prompt], round_up(len(prompt), 8) + new_tokens)
  return np.asarray(session.generate(new_tokens, SamplingRule(temperature=0.0)).tokens_BN)[0]


def greedy_agreement(ours_model, config, model, prompt, tokenizer, new_tokens: int) -> int:
  """Prints and returns how many of the first `new_tokens` greedy tokens of both samplers agree on `prompt`."""
  ours = ours_greedy(ours_model, prompt, new_tokens)
  theirs = tunix_generate(config, model, [prompt], tokenizer, new_tokens, greedy=True)()[0]
  same = ours == theirs
  prefix = int(np.argmin(same)) if not same.all() else new_tokens
  print(f"greedy agreement, batch 1, prompt 0: {int(same.sum())}/{new_tokens} new tokens equal, the first {prefix} "
        f"in a row\n  ours:  {ours.tolist()}\n  tunix: {theirs.tolist()}\n  ours as text: "
        f"{tokenizer.decode(ours.tolist())!r}", flush=True)
  return prefix


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batches", default="1,16,64")
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--check-tokens", type=int, default=16)
  parser.add_argument("--tunix-rope-as-shipped", action="store_true")
  args = parser.parse_args()

  import importlib.metadata

  import transformers

  path = bundled_model_dir()
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  ours = load_pretrained(path, dtype="float32")
  ours = dataclasses.replace(ours, config=dataclasses.replace(ours.config, eos_token_ids=()))
  config, model = tunix_model(path, args.tunix_rope_as_shipped)
  n_params = sum(x.size for x in jax.tree.leaves(ours.params))
  print(f"SmolLM2-135M ({n_params / 1e6:.1f}M params, float32), tunix {importlib.metadata.version('google-tunix')}, "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s), {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}", flush=True)
  agreed = greedy_agreement(ours, config, model, chat_prompts(tokenizer, 1)[0], tokenizer, args.check_tokens)
  for batch in map(int, args.batches.split(",")):
    prompts = chat_prompts(tokenizer, batch)
    theirs = tunix_tokens_per_second(config, model, prompts, tokenizer, args.new_tokens)
    report(f"tunix Sampler, batch {batch}", theirs, "tok/s")
    mine = ours_tokens_per_second(ours, prompts, args.new_tokens)
    report(f"ragen_jax sampler, batch {batch}", mine, "tok/s", "tunix Sampler", theirs)
    unrolled = dataclasses.replace(ours, config=dataclasses.replace(ours.config, decode_layers="unrolled"))
    report(f"ragen_jax sampler, layers unrolled, batch {batch}", ours_tokens_per_second(unrolled, prompts,
           args.new_tokens), "tok/s", "tunix Sampler", theirs)
  if agreed < args.check_tokens:
    sys.exit(f"tunix and ours agree on only {agreed} of the first {args.check_tokens} greedy tokens")


if __name__ == "__main__":
  main()
