"""The learner's throughput, and one GRPO iteration's phases, against the matmul peak measured in the same run.

  .venv/bin/python bench/update.py [--models smollm2-135m,demo] [--tokens 512] [--episodes 16] [--micro 4]
      [--dtype bfloat16] [--remat dots] [--rollout] [--diagnostics]  # bench/gpu.sh: qwen2.5-1.5b, all phases

A GRPO batch of `--episodes` episodes of `--tokens` tokens each (a prompt of a quarter, then one generated reply,
all of it reasoning; rewards spread so every group has advantages), random weights at each model's shapes:
`models.shapes` names, or `demo` (the demo's scratch model: hidden 128, 4 layers, its 1,536-token vocabulary).
Weights are f32, the compute in `--dtype`. The phases, each jitted as the trainer runs it:
- rollout (`--rollout`): prefill the prompts, then decode the reply's tokens with EOS disabled (`sampling`);
- score: `rl.update.score`, the pre-update log-probs and entropy, in micro-batches of `--micro`;
- diagnose (`--diagnostics`): `rl.update.diagnose` with the collapse diagnostics at their defaults;
- learn: `rl.update.learn`, filter, advantages and one PPO epoch of forward + backward + AdamW over one mini-batch
  of all the episodes.
FLOPs are the planner's (`models.flops.forward_flops`, `train_pass_flops`: 2 per matmul weight per token, the LM head
included, and attention's two products over the (query, key) pairs computed; the backward twice the forward), as
a share of the matmul peak of the compute dtype (`bench/limits.py`); neither the diagnostics' FLOPs nor what `--remat`
recomputes are counted.
Then each phase's op profile, one more call under `jax.profiler` (`bench/profiling.py`; `--no-profile`: none).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench.common import report, timed  # noqa: E402
from bench.limits import measure  # noqa: E402
from bench.profiling import op_profile, print_profile  # noqa: E402
from ragen_jax import sampling  # noqa: E402
from ragen_jax.diagnostics.collapse import CollapseConfig, init_diagnostics_state, make_diagnostics_fn  # noqa: E402
from ragen_jax.models import ModelConfig, init_params  # noqa: E402
from ragen_jax.models.config import REMAT  # noqa: E402
from ragen_jax.models.flops import causal_key_pairs, forward_flops, train_pass_flops  # noqa: E402
from ragen_jax.models.shapes import shape_config  # noqa: E402
from ragen_jax.rl.presets import preset  # noqa: E402
from ragen_jax.rl.snr_filter import FilterConfig  # noqa: E402
from ragen_jax.rl.update import OptimizerConfig, UpdateConfig, diagnose, init_train_state, learn, score  # noqa: E402
from ragen_jax.trajectories import Trajectories, TrajectoryWriter  # noqa: E402

GROUP_SIZE = 8


def model_config(name: str, dtype: str, remat: str = "none") -> ModelConfig:
  """Shapes `name` (`models.shapes`, or "demo": the demo's scratch model, configs/demo.py: hidden 128, 4 layers,
  a 1,500-token vocabulary rounded to 1,536), f32 weights computed in `dtype`, EOS disabled, layers rematerialised
  in the backward as `remat` says (`ModelConfig.remat`)."""
  if name != "demo":
    return shape_config(name, dtype=dtype, param_dtype="float32", eos_token_ids=(), remat=remat)
  return ModelConfig(vocab_size=1536, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                     num_kv_heads=2, head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                     max_position_embeddings=4096, eos_token_ids=(), pad_token_id=0, dtype=dtype, remat=remat)


def synthetic_batch(config: ModelConfig, episodes: int, tokens: int, key) -> Trajectories:
  """`episodes` single-turn episodes of `tokens` random tokens: a prompt of tokens // 4, then one reply."""
  prompt = tokens // 4
  token_key, logp_key, reward_key = jax.random.split(key, 3)
  tokens_BT = jax.random.randint(token_key, (episodes, tokens), 2, config.vocab_size, jnp.int32)
  everyone = jnp.ones((episodes,), bool)
  zeros = jnp.zeros((episodes,), jnp.int32)
  writer = TrajectoryWriter.empty(episodes, tokens, 1).write_chunk(
      0, 0, tokens_BT[:, :prompt], jnp.ones((episodes, prompt), bool), jnp.ones((episodes, prompt), jnp.int32), zeros)
  reply = jnp.full((episodes,), tokens - prompt, jnp.int32)
  logp_BN = -jax.random.uniform(logp_key, (episodes, tokens - prompt), jnp.float32, 0.1, 5.0)
  reward_B = jax.random.uniform(reward_key, (episodes,), jnp.float32)
  writer = writer.write_reply(prompt, 0, everyone, tokens_BT[:, prompt:], reply, logp_BN, zeros, reward_B, everyone,
                              reply, zeros)
  return writer.finish(reward_B > 0.5, jnp.arange(episodes) // GROUP_SIZE)


def rollout_flops(config: ModelConfig, episodes: int, prompt: int, new_tokens: int) -> float:
  """The prefill's forward and every decode step's (one token a row reading the cache so far)."""
  total = forward_flops(config, episodes * prompt, episodes * causal_key_pairs(prompt), episodes)
  for step in range(new_tokens):
    total += forward_flops(config, episodes, episodes * (prompt + step + 1), episodes)
  return total


def rollout_program(config: ModelConfig, episodes: int, prompt: int, new_tokens: int):
  """The jitted rollout of one turn: (params, prompts_BT, key) -> generated tokens."""
  rule = sampling.SamplingRule(temperature=1.0)

  @jax.jit
  def rollout(params, prompts_BT, key):
    state = sampling.prefill(config, params, prompts_BT, jnp.ones(prompts_BT.shape, bool), prompt + new_tokens)
    return sampling.decode(config, params, state, key, rule=rule, max_new_tokens=new_tokens)[1].tokens_BN

  return rollout


def measure_model(name: str, args, peak: float) -> None:
  config = model_config(name, args.dtype, args.remat)
  diagnostics = CollapseConfig()
  cfg = UpdateConfig(algorithm=preset("grpo"), filter=FilterConfig(enabled=False),
                     num_groups=args.episodes // GROUP_SIZE, group_size=GROUP_SIZE, mini_batch_size=args.episodes,
                     micro_batch_size=args.micro, policy_optimizer=OptimizerConfig(lr=1e-6),
                     diagnostics_fn=make_diagnostics_fn(diagnostics, args.episodes // GROUP_SIZE, GROUP_SIZE))
  params = init_params(config, jax.random.key(0))
  batch = synthetic_batch(config, args.episodes, args.tokens, jax.random.key(1))
  n_params = sum(x.size for x in jax.tree.leaves(params))
  print(f"{name}: {n_params / 1e6:.1f}M params, f32 weights, {args.dtype} compute; {args.episodes} episodes x "
        f"{args.tokens} tokens, micro-batches of {args.micro}, remat {config.remat}", flush=True)
  tokens, pairs = args.episodes * args.tokens, args.episodes * causal_key_pairs(args.tokens)
  flops = {"score": forward_flops(config, tokens, pairs, tokens),
           "learn": train_pass_flops(config, tokens, pairs, tokens)}
  seconds = {}
  state = init_train_state(cfg, params, jax.random.key(2), diagnostics=init_diagnostics_state(diagnostics))
  if args.rollout:
    prompt = args.tokens // 4
    rollout = rollout_program(config, args.episodes, prompt, args.tokens - prompt)
    jax.block_until_ready(rollout(params, batch.tokens[:, :prompt], jax.random.key(3)))  # compile
    seconds["rollout"], _ = timed(rollout, params, batch.tokens[:, :prompt], jax.random.key(3), repeats=args.repeats)
    flops["rollout"] = rollout_flops(config, args.episodes, prompt, args.tokens - prompt)
  scores = jax.block_until_ready(score(config, cfg, state, None, batch))  # compile
  seconds["score"], scores = timed(lambda: score(config, cfg, state, None, batch), repeats=args.repeats)
  # diagnose and learn donate the state: each run gets a fresh copy, made before its clock starts
  phases = {"learn": learn.lower(config, cfg, state, batch, scores).compile()}
  if args.diagnostics:
    phases = {"diagnose": diagnose.lower(config, cfg, state, batch, scores).compile()} | phases
  for phase, compiled in phases.items():
    seconds[phase] = float("inf")
    for _ in range(args.repeats + 1):  # the first run warms up
      fresh = jax.block_until_ready(jax.tree.map(jnp.copy, state))
      took, (_, metrics) = timed(compiled, fresh, batch, scores)
      seconds[phase] = min(seconds[phase], took)
    if phase == "learn":
      assert float(metrics["num_updates"]) == 1.0, metrics["num_updates"]
  if args.profile:
    if args.rollout:
      prompts = (params, batch.tokens[:, :args.tokens // 4], jax.random.key(3))
      print_profile(f"{name} rollout", op_profile(rollout.lower(*prompts).compile(), [prompts]))
    print_profile(f"{name} score", op_profile(score.lower(config, cfg, state, None, batch).compile(),
                                              [(state, None, batch)]))
    for phase, compiled in phases.items():
      print_profile(f"{name} {phase}", op_profile(compiled, [(jax.tree.map(jnp.copy, state), batch, scores)]))
  for phase, took in seconds.items():
    if phase in flops:
      report(f"{name} {phase}: {flops[phase] / 1e9:.0f} GFLOP in {took:.3f} s", flops[phase] / took / 1e9, "GFLOP/s",
             "matmul peak", peak)
    else:
      print(f"{name} {phase}: {took:.3f} s (FLOPs not counted)", flush=True)
  total = sum(seconds.values())
  report(f"{name} whole iteration ({', '.join(seconds)}) in {total:.3f} s", sum(flops.values()) / total / 1e9,
         "GFLOP/s", "matmul peak", peak)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", default="smollm2-135m,demo")
  parser.add_argument("--tokens", type=int, default=512)
  parser.add_argument("--episodes", type=int, default=16)
  parser.add_argument("--micro", type=int, default=4)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--remat", default="none", choices=REMAT, help="ModelConfig.remat: what the backward recomputes")
  parser.add_argument("--rollout", action="store_true")
  parser.add_argument("--diagnostics", action="store_true")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                      help="print each phase's op profile (bench/profiling.py)")
  args = parser.parse_args()
  if args.episodes % GROUP_SIZE or args.episodes % args.micro:
    sys.exit(f"--episodes {args.episodes} must be a multiple of {GROUP_SIZE} and of --micro {args.micro}")
  print(f"{jax.device_count()} {jax.devices()[0].platform} device(s), {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f}")
  peak = measure(verbose=False).peak(args.dtype) / 1e9
  report(f"{args.dtype} matmul peak (bench/limits.py)", peak, "GFLOP/s")
  for name in args.models.split(","):
    measure_model(name, args, peak)


if __name__ == "__main__":
  main()
