"""Multi-turn rollout throughput: the device path (one jit, KV cache continued across
turns) against pure decoding and against the host path that re-prefills every history each turn (RAGEN's way).

  .venv/bin/python bench/rollout.py [--models demo,demo-words,smollm2] [--batch 64] [--smollm2-batch 16] [--turns 5]
      [--new-tokens 32]

For each model (the demo's shape with random weights, with the demo's own tokenizer and with one that stops at word
boundaries; the bundled SmolLM2-135M-Instruct), both paths play the same
5-turn Sokoban episodes with EOS disabled, and pure decoding generates as many tokens per row at the same batch from
the same first prompts (one prefill, one decode: the rollout's limit). Rates are rows x decode steps per second,
with each path's cost over pure decode (issue 37's target: the device path's rendering, parsing, env steps and
chunk prefills together within +20%). Then one training iteration of the trainer on the demo model (same env and
batch; GRPO without the filter, collapse diagnostics at compute_freq 1) is timed and split into rollout, scoring,
diagnostics and update.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import envs  # noqa: E402
from bench.common import report, timed  # noqa: E402
from bench.limits import measure  # noqa: E402
from ragen_jax import mesh as mesh_lib  # noqa: E402
from ragen_jax.assembly import load_model  # noqa: E402
from ragen_jax.config import load_config_file  # noqa: E402
from ragen_jax.demo.stages import build_tokenizer  # noqa: E402
from ragen_jax.models import Model, init_params  # noqa: E402
from ragen_jax.models.scratch import scratch_config  # noqa: E402
from ragen_jax.models.tokenizer import train_tokenizer  # noqa: E402
from ragen_jax.rollout import prompt  # noqa: E402
from ragen_jax.rollout.device import device_rollout, slot_layout  # noqa: E402
from ragen_jax.rollout.episodes import RolloutConfig, build_assets, reset_batch, train_seeds, unbatch  # noqa: E402
from ragen_jax.rollout.host import host_rollout, reprefill_policy  # noqa: E402
from ragen_jax.sampling import SamplingSession  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--models", default="demo,demo-words,smollm2", help="comma-separated: demo, demo-words, smollm2")
  parser.add_argument("--batch", type=int, default=64, help="episodes of the demo model")
  parser.add_argument("--smollm2-batch", type=int, default=16, help="episodes of SmolLM2-135M")
  parser.add_argument("--turns", type=int, default=5)
  parser.add_argument("--new-tokens", type=int, default=32)
  args = parser.parse_args()
  print(f"{jax.device_count()} {jax.devices()[0].platform} device(s), {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}")
  models = {name: rollout_model(name) for name in args.models.split(",")}
  for name, (model, tokenizer) in models.items():
    compare_paths(name, model, tokenizer, args.smollm2_batch if name == "smollm2" else args.batch, args.turns,
                  args.new_tokens)
  if "demo" in models:  # last: the trainer points JAX's compilation cache into its (temporary) run directory
    iteration_split(*models["demo"], args)


def rollout_model(name: str) -> tuple[Model, object]:
  """(model, tokenizer): "demo", configs/demo.py's model shape with random weights and the demo's own tokenizer
  (`demo.stages.build_tokenizer`: its merges cross spaces, so fixed phrases are few tokens); "demo-words", the same
  model with a tokenizer whose tokens stop at word boundaries, trained on Sokoban text (longer prompts);
  "smollm2", the bundled SmolLM2-135M-Instruct and its tokenizer."""
  mesh = mesh_lib.single_device_mesh()
  if name == "smollm2":
    return load_model("", mesh)
  demo_config = load_config_file(os.path.join(ROOT, "configs/demo.py"))
  if name == "demo":
    tokenizer = build_tokenizer(demo_config, demo_config.demo.envs.split(","), None)
  else:
    env, params = envs.make("sokoban")
    states = reset_batch(env, params, jnp.arange(64))
    texts = [env.render_text(unbatch(states, i), params) for i in range(64)]
    texts += [prompt.system_text(env.instruction_text(params, 10)), prompt.FORMAT_REMINDER] * 20
    tokenizer = train_tokenizer(texts, 1000)
  demo = demo_config.demo
  model_config = scratch_config(tokenizer, hidden_size=demo.hidden_size, num_layers=demo.num_layers,
                                num_heads=demo.num_heads, num_kv_heads=demo.num_kv_heads)
  return Model(model_config, init_params(model_config, jax.random.key(0)), mesh), tokenizer


def compare_paths(name: str, model: Model, tokenizer, batch: int, turns: int, new_tokens: int) -> None:
  """The device path, the host re-prefill path and pure decoding of `turns` x `new_tokens` tokens at `batch`."""
  env, params = envs.make("sokoban")
  # EOS disabled: every turn generates exactly new-tokens tokens on every path.
  model = dataclasses.replace(model, config=dataclasses.replace(model.config, eos_token_ids=()))
  config = RolloutConfig(max_turns=turns, max_new_tokens=new_tokens, max_actions_per_traj=100, temperature=1.0,
                         max_model_len=0)
  assets = build_assets(tokenizer, env, params, config, table_size=model.config.vocab_size)
  seeds = jnp.asarray(train_seeds(0, batch // 8, 8))
  groups = jnp.repeat(jnp.arange(batch // 8), 8)
  n_params = sum(x.size for x in jax.tree.leaves(model.params))
  seq_len = slot_layout(assets, config)[2]
  print(f"\n{name}: Sokoban, {turns} turns x {new_tokens} new tokens, batch {batch}, model {n_params / 1e6:.2f}M "
        f"params, {seq_len} token slots per episode", flush=True)

  def device():
    return device_rollout(model.config, model.params, env, params, assets, config, seeds, groups, jax.random.key(0))

  def host():
    return host_rollout(reprefill_policy(model, config, assets), env, params, assets, config, seeds, groups,
                        jax.random.key(0), seq_len=seq_len)

  seconds = {}
  for path, fn in (("device", device), ("host", host)):
    fn()  # compile
    seconds[path], traj = timed(fn)
  # Pure decoding: the device path's first prompts, prefilled, then every turn's tokens in one decode.
  tokens, valid, start = (np.asarray(x) for x in (traj.tokens, traj.valid, traj.response_start[:, 0]))
  first_prompts = [tokens[i, :start[i]][valid[i, :start[i]]].tolist() for i in range(batch)]
  steps = turns * new_tokens

  def pure():
    session = SamplingSession.for_replies(model, first_prompts, steps)
    return session.generate(steps, config.rule, key=jax.random.key(0))

  pure()  # compile
  seconds["pure"], _ = timed(pure)
  rate = {path: batch * steps / s for path, s in seconds.items()}  # every row runs every turn's decode steps
  report(f"{name}: pure decode of {steps} tokens per row", rate["pure"], "tok/s")
  report(f"{name}: host path (re-prefill each turn)", rate["host"], "tok/s", "pure decode", rate["pure"])
  report(f"{name}: device path (cache across turns)", rate["device"], "tok/s", "pure decode", rate["pure"])
  report(f"{name}: device path against the host path", rate["device"], "tok/s", "host re-prefill path", rate["host"])
  print(f"  {name}: the device path costs {100 * (seconds['device'] / seconds['pure'] - 1):+.0f}% over pure decode "
        f"(target <= +20%), the host path {100 * (seconds['host'] / seconds['pure'] - 1):+.0f}%", flush=True)


def iteration_split(model, tokenizer, args):
  """One trainer iteration (after a compiling one), split into its phases."""
  from ragen_jax.trainer import Trainer
  with tempfile.TemporaryDirectory() as workdir:
    config = load_config_file(os.path.join(ROOT, "configs/base.py"))
    config.model.path = str(model.export(os.path.join(workdir, "model"), tokenizer))
    config.workdir = os.path.join(workdir, "run")
    config.rollout.max_turns, config.rollout.max_new_tokens = args.turns, args.new_tokens
    config.rollout.max_actions_per_traj = 100
    config.algorithm.preset = "grpo"
    config.filter.enabled = False  # a random model's groups all score alike: the filter would skip the update
    config.train.env_groups, config.train.group_size = args.batch // 8, 8
    config.train.mini_batch_size = min(config.train.mini_batch_size, args.batch)
    config.train.val_every, config.train.checkpoint_every = 0, 0
    config.logging.tensorboard = config.logging.progress_bar = False
    trainer = Trainer.create(config)
    trainer.train_iteration()  # compile
    metrics = trainer.train_iteration()
    trainer.checkpointer.close()
  total = metrics["time/iteration_s"]
  print(f"one training iteration ({args.batch} episodes, GRPO, diagnostics at compute_freq 1): {total:.2f} s")
  for phase in ("rollout", "scoring", "diagnostics", "update"):
    seconds = metrics[f"time/{phase}_s"]
    print(f"  {phase:<12s} {seconds:8.2f} s  {100 * seconds / total:5.1f}%", flush=True)
  # Dense-model FLOPs of the learner on every slot of the [batch, seq] batch (attention not counted):
  # 2 per parameter per token forward (scoring), 6 forward + backward (update).
  n_params = sum(x.size for x in jax.tree.leaves(model.params))
  slots = args.batch * trainer.exp.source.seq_len
  peak = measure().f32_flops
  report("scoring (forward, 2 FLOPs/param/token)", 2 * n_params * slots / metrics["time/scoring_s"] / 1e9, "GFLOP/s",
         "matmul peak", peak / 1e9)
  report("update step (6 FLOPs/param/token)", 6 * n_params * slots / metrics["time/update_s"] / 1e9, "GFLOP/s",
         "matmul peak", peak / 1e9)


if __name__ == "__main__":
  main()
