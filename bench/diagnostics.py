"""Cost of the collapse diagnostics: their share of the jitted update, and cached vs naive cross-scoring.

  .venv/bin/python bench/diagnostics.py [--layers 4 --hidden 256 --vocab 8192 --groups 8 --group-size 16]

A random model and a synthetic batch (G groups × S episodes of three turns, ~300 tokens:
a shared 100-token first prompt, replies of 16–48 reasoning tokens + `</think>` + 8
answer tokens, 30-token observations; `--prompt-tokens` / `--observation-tokens` make
the context longer). Times, best of `--repeats`, in process CPU seconds:
  (a) the whole jitted update (GRPO preset, SNR filter on) without and with the
      diagnostics at compute_freq 1, both variants, R = 64: share = extra / with; and
      the rollout's model work (the sampler generating the batch's token counts) for the
      share of a whole iteration;
  (b) the scorer alone per variant, its prompt prefill alone (rows of length 0), and the
      naive reference-style scoring of R × N full [prompt | reasoning] sequences.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from ragen_jax import sampling  # noqa: E402
from ragen_jax.diagnostics import cross_scoring as xs  # noqa: E402
from ragen_jax.diagnostics.collapse import CollapseConfig, init_diagnostics_state, make_diagnostics_fn  # noqa: E402
from ragen_jax.models import ModelConfig, forward_logits, init_params  # noqa: E402
from ragen_jax.rl.presets import preset  # noqa: E402
from ragen_jax.rl.snr_filter import FilterConfig  # noqa: E402
from ragen_jax.rl.update import OptimizerConfig, UpdateConfig, init_train_state, update  # noqa: E402
from tests.diagnostics.batch_fixtures import make_batch, random_episodes  # noqa: E402

TURNS = 3


def timed(fn, *args, repeats: int):
  """((wall, process CPU) best seconds, last result) of fn(*args); CPU time is what other load
  on a shared machine does not inflate, so shares are computed from it."""
  wall, cpu, out = float("inf"), float("inf"), None
  for _ in range(repeats):
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn(*args))
    wall, cpu = min(wall, time.perf_counter() - start_wall), min(cpu, time.process_time() - start_cpu)
  return (wall, cpu), out


def seconds_text(wall_cpu) -> str:
  return f"{wall_cpu[0]:8.3f} s wall {wall_cpu[1]:8.3f} s cpu"


def synthetic_batch(groups: int, group_size: int, vocab: int, prompt_tokens: int = 100,
                    observation_tokens: int = 30, seed: int = 0):
  episodes = random_episodes(np.random.default_rng(seed), groups, group_size, TURNS, vocab,
                             prompt_len=(prompt_tokens, prompt_tokens), reasoning_len=(16, 48), answer_len=(8, 8),
                             obs_len=(observation_tokens, observation_tokens), open_share=0.05, min_turns=TURNS)
  seq_len = max(len(e.turn_texts()[-1][0]) + len(e.turns[-1].reply) for e in episodes)
  return make_batch(episodes, -(-seq_len // 16) * 16, TURNS)


def naive_cross_logp(config: ModelConfig, params, batch, pairs: xs.CrossPairs, max_tokens: int,
                     rows_per_step: int = 16):
  """The reference's way: every (row, column) pair as its own full sequence [x_j | z_r]."""
  reasoning_RZ, length_R = xs.gather_reasoning(batch.tokens, batch, pairs.row_episode, pairs.row_turn, max_tokens)
  prompts_NT, prompt_len_N, _, _ = xs.gather_prompts(batch, pairs.col_episode, pairs.col_turn, batch.seq_len)
  width = batch.seq_len + max_tokens
  position = jnp.arange(width)

  def column(args):
    prompt_T, prompt_len = args
    prompt_W = jnp.pad(prompt_T, (0, max_tokens))

    def rows(chunk):
      reasoning_CZ, length_C = chunk
      inside_CW = (position >= prompt_len) & (position < prompt_len + length_C[:, None])
      reasoning_CW = jnp.take(reasoning_CZ, jnp.clip(position - prompt_len, 0, max_tokens - 1), axis=1)
      tokens_CW = jnp.where(position < prompt_len, prompt_W, reasoning_CW)
      logits = forward_logits(config, params, tokens_CW, position < prompt_len + length_C[:, None])
      logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens_CW[:, 1:, None], axis=-1)[..., 0]
      return jnp.sum(jnp.where(inside_CW[:, 1:], logp, 0.0), axis=1)

    split = lambda x: x.reshape(-1, rows_per_step, *x.shape[1:])  # noqa: E731
    return jax.lax.map(rows, (split(reasoning_RZ), split(length_R))).reshape(-1)

  return jax.lax.map(column, (prompts_NT, prompt_len_N)).T


def generation_seconds(config: ModelConfig, params, batch, repeats: int) -> tuple[float, float]:
  """Time to generate this batch's token counts with the sampler (prefill the first prompt,
  then per turn decode the longest reply and extend the observation), as a rollout would."""
  first = int(batch.response_start[0, 0])
  reply = int(jnp.max(batch.response_len))
  observation = int(batch.response_start[0, 1] - batch.response_start[0, 0] - batch.response_len[0, 0])
  slots = first + TURNS * reply + (TURNS - 1) * observation
  rule = sampling.SamplingRule(temperature=1.0)

  @jax.jit
  def rollout(params, tokens_BT, key):
    state = sampling.prefill(config, params, tokens_BT[:, :first], jnp.ones((batch.batch_size, first), bool), slots)
    for turn in range(TURNS):
      state, gen = sampling.decode(config, params, state, jax.random.fold_in(key, turn), rule=rule,
                                   max_new_tokens=reply)
      if turn + 1 < TURNS:
        chunk = tokens_BT[:, :observation]
        state = sampling.extend(config, params, state, chunk, jnp.ones(chunk.shape, bool))
    return gen.tokens_BN

  rollout = rollout.lower(params, batch.tokens, jax.random.key(0)).compile()
  return timed(rollout, params, batch.tokens, jax.random.key(0), repeats=repeats)[0]


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--vocab", type=int, default=8192)
  parser.add_argument("--groups", type=int, default=8)
  parser.add_argument("--group-size", type=int, default=16)
  parser.add_argument("--prompt-tokens", type=int, default=100, help="first prompt (system + first user turn)")
  parser.add_argument("--observation-tokens", type=int, default=30, help="each later user turn")
  parser.add_argument("--samples", type=int, default=64)
  parser.add_argument("--max-reasoning-tokens", type=int, default=64)
  defaults = CollapseConfig()
  parser.add_argument("--block-tokens", type=int, default=defaults.block_tokens)
  parser.add_argument("--columns-per-step", type=int, default=defaults.columns_per_step)
  parser.add_argument("--rows-per-step", type=int, default=defaults.rows_per_step, help="0: all rows in one step")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--skip-naive", action="store_true")
  parser.add_argument("--skip-rollout", action="store_true")
  args = parser.parse_args()

  config = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                       num_layers=args.layers, num_heads=args.hidden // 64, num_kv_heads=args.hidden // 64, head_dim=64)
  params = init_params(config, jax.random.key(0))
  batch = synthetic_batch(args.groups, args.group_size, args.vocab, args.prompt_tokens, args.observation_tokens)
  diag_cfg = CollapseConfig(num_samples=args.samples, max_reasoning_tokens=args.max_reasoning_tokens,
                            block_tokens=args.block_tokens, columns_per_step=args.columns_per_step,
                            rows_per_step=args.rows_per_step)
  tokens = int(jnp.sum(batch.valid))
  print(f"model: {args.layers} layers, d={args.hidden}, vocab {args.vocab}; batch {args.groups}×{args.group_size} "
        f"episodes, seq_len {batch.seq_len}, {tokens / batch.batch_size:.0f} tokens/episode, "
        f"{float(jnp.mean(batch.reasoning_len)):.1f} reasoning tokens/turn; devices: {jax.device_count()} "
        f"{jax.devices()[0].platform}", flush=True)

  # (a) the update with and without the diagnostics.
  times = {}
  for name, diagnostics_fn in [("update", None),
                               ("update + diagnostics", make_diagnostics_fn(diag_cfg, args.groups, args.group_size))]:
    update_cfg = UpdateConfig(algorithm=preset("grpo"), filter=FilterConfig(), num_groups=args.groups,
                              group_size=args.group_size, policy_optimizer=OptimizerConfig(lr=1e-6, weight_decay=1e-4),
                              diagnostics_fn=diagnostics_fn)
    step = jax.jit(functools.partial(update, config, update_cfg))
    state = init_train_state(update_cfg, params, jax.random.key(1), diagnostics=init_diagnostics_state(diag_cfg))
    step = step.lower(state, params, batch).compile()
    times[name], (_, metrics) = timed(step, state, params, batch, repeats=args.repeats)
    print(f"{name:<40s} {seconds_text(times[name])}", flush=True)
  with_diag = times["update + diagnostics"][1]
  extra = with_diag - times["update"][1]
  print(f"kept groups {float(metrics['filter_kept_count']):.0f}/{args.groups}; "
        f"diagnostics share of the update: {extra / with_diag:.1%} (+{extra:.3f} s cpu)", flush=True)
  if not args.skip_rollout:
    generation = generation_seconds(config, params, batch, args.repeats)
    print(f"{'generation (rollout model work)':<40s} {seconds_text(generation)}; diagnostics share of "
          f"rollout + update: {extra / (generation[1] + with_diag):.1%}", flush=True)

  # (b) the scorer alone, its prefill alone, and the naive way.
  window = batch.seq_len
  for variant in diag_cfg.variants:
    if variant == "first_turn":
      pairs = xs.first_turn_pairs(batch, args.groups, min(args.samples, batch.batch_size), jax.random.key(2), window)
    else:
      pairs = xs.trajectory_pairs(batch, args.samples, jax.random.key(2), window)
    scorer = jax.jit(functools.partial(xs.score_pairs, config, max_reasoning_tokens=args.max_reasoning_tokens,
                                       prompt_window=window, block_tokens=args.block_tokens,
                                       columns_per_step=args.columns_per_step,
                                       rows_per_step=args.rows_per_step))
    scorer = scorer.lower(params, batch, pairs).compile()
    seconds, (cached, _) = timed(scorer, params, batch, pairs, repeats=args.repeats)
    prefill_only, _ = timed(scorer, params, batch, pairs.replace(row_mask=jnp.zeros_like(pairs.row_mask)),
                            repeats=args.repeats)
    rows, cols = pairs.row_mask.shape[0], pairs.col_episode.shape[0]
    print(f"{variant}: R={rows} × N={cols}; cached scorer {seconds_text(seconds)}, of which prompt prefill "
          f"{prefill_only[1]:.3f} s cpu", flush=True)
    if not args.skip_naive:
      naive = jax.jit(functools.partial(naive_cross_logp, config, max_tokens=args.max_reasoning_tokens))
      naive = naive.lower(params, batch, pairs).compile()
      naive_seconds, reference = timed(naive, params, batch, pairs, repeats=1)
      gap = float(jnp.max(jnp.abs(reference - cached)))
      print(f"{variant}: naive R×N full sequences {seconds_text(naive_seconds)} = "
            f"{naive_seconds[1] / seconds[1]:.1f}x the cached scorer (max |ΔS| {gap:.1e})", flush=True)


if __name__ == "__main__":
  main()
