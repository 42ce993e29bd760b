"""Multi-turn rollout throughput: the device path (one jit, KV cache continued across
turns) against the host path that re-prefills every history each turn (RAGEN's way).

  .venv/bin/python bench/rollout.py [--batch 64] [--turns 5] [--new-tokens 32]

Both paths play the same 5-turn Sokoban episodes with the same small model and
print generated tokens per second and their ratio, in one run. Then one training
iteration of the trainer (same model, env and batch; GRPO without the filter, collapse
diagnostics at compute_freq 1) is timed and split into rollout, scoring, diagnostics and update.
"""

from __future__ import annotations

import argparse
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
from ragen_jax.models import Model, init_params  # noqa: E402
from ragen_jax.models.scratch import scratch_config  # noqa: E402
from ragen_jax.models.tokenizer import train_tokenizer  # noqa: E402
from ragen_jax.rollout import prompt  # noqa: E402
from ragen_jax.rollout.device import device_rollout, slot_layout  # noqa: E402
from ragen_jax.rollout.episodes import RolloutConfig, build_assets, reset_batch, train_seeds, unbatch  # noqa: E402
from ragen_jax.rollout.host import host_rollout, reprefill_policy  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--turns", type=int, default=5)
  parser.add_argument("--new-tokens", type=int, default=32)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--layers", type=int, default=4)
  args = parser.parse_args()

  env, params = envs.make("sokoban")
  states = reset_batch(env, params, jnp.arange(64))
  texts = [env.render_text(unbatch(states, i), params) for i in range(64)]
  texts += [prompt.system_text(env.instruction_text(params, 10)), prompt.FORMAT_REMINDER] * 20
  tokenizer = train_tokenizer(texts, 1000)
  model_config = scratch_config(tokenizer, hidden_size=args.hidden, num_layers=args.layers)
  model = Model(model_config, init_params(model_config, jax.random.key(0)), mesh_lib.single_device_mesh())
  # EOS disabled: every turn generates exactly new-tokens tokens on both paths.
  no_eos = Model(model_config.__class__(**{**model_config.__dict__, "eos_token_ids": ()}), model.params, model.mesh)
  config = RolloutConfig(max_turns=args.turns, max_new_tokens=args.new_tokens, max_actions_per_traj=100,
                         temperature=1.0, max_model_len=0)
  assets = build_assets(tokenizer, env, params, config, table_size=model_config.vocab_size)
  seeds = jnp.asarray(train_seeds(0, args.batch // 8, 8))
  groups = jnp.repeat(jnp.arange(args.batch // 8), 8)
  n_params = sum(x.size for x in jax.tree.leaves(model.params))
  print(f"Sokoban, {args.turns} turns x {args.new_tokens} new tokens, batch {args.batch}, model {n_params / 1e6:.2f}M "
        f"params, {slot_layout(assets, config)[2]} token slots per episode")

  def device():
    return device_rollout(no_eos.config, no_eos.params, env, params, assets, config, seeds, groups, jax.random.key(0))

  def host():
    return host_rollout(reprefill_policy(no_eos, config, assets), env, params, assets, config, seeds, groups,
                        jax.random.key(0), seq_len=slot_layout(assets, config)[2])

  results = {}
  for name, fn in (("device path (cache across turns)", device), ("host path (re-prefill each turn)", host)):
    fn()  # compile
    seconds, traj = timed(fn)
    generated = int(np.sum(np.asarray(traj.loss_mask)))
    results[name] = generated / seconds
  (dev_name, dev), (host_name, hst) = results.items()
  report(host_name, hst, "gen tok/s")
  report(dev_name, dev, "gen tok/s", "host re-prefill path", hst)
  iteration_split(model, tokenizer, args)


def iteration_split(model, tokenizer, args):
  """One trainer iteration (after a compiling one), split into its phases."""
  from ragen_jax.config import load_config_file
  from ragen_jax.trainer import Trainer
  with tempfile.TemporaryDirectory() as workdir:
    config = load_config_file(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           "configs/base.py"))
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
