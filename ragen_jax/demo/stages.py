"""The demo's stages: a tokenizer and SFT warm start on solver demonstrations, then RL per environment.

`python -m ragen_jax.demo` and `python -m ragen_jax.demo.compare` run these stages.
"""

from __future__ import annotations

import copy
import time

import jax
import jax.numpy as jnp
import numpy as np

import envs
from ragen_jax import config as config_lib
from ragen_jax import mesh as mesh_lib
from ragen_jax import paths
from ragen_jax.assembly import build_mesh, build_source, load_model
from ragen_jax.demo.demonstrations import (TEMPLATE_STYLES, TEMPLATES, corpus, format_rows, plan_and_reason,
                                          reading_rates, solver_policy)
from ragen_jax.models import init_params
from ragen_jax.models.hf_io import export_hf
from ragen_jax.models.scratch import scratch_config
from ragen_jax.models.tokenizer import train_tokenizer
from ragen_jax.report.summary import plot_run, write_report
from ragen_jax.rollout import prompt
from ragen_jax.rollout.device import slot_layout
from ragen_jax.rollout.episodes import RolloutConfig, build_assets, reset_batch, unbatch
from ragen_jax.rollout.host import host_rollout
from ragen_jax.sft import fit, lr_schedule
from ragen_jax.trainer import Trainer, read_settings, use_compilation_cache
from ragen_jax.trajectories import rollout_metrics

DEMO_SEED_BASE = 50_000  # demonstration seeds, apart from training (10000+) and validation (123+)
FORMAT_ROW_LEN = 128     # tokens per row of the format stages (4-5 packed replies, or an observation and its reply)


def share_compiled_programs(config) -> None:
  """Every run of a multi-run comparison or study compiles the same rollout, scoring and diagnostics: keep them in
  the persistent compilation cache, so each later run loads them from disk."""
  use_compilation_cache(config.train.compilation_cache, config.workdir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def log(message: str):
  print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def build_tokenizer(config, env_names, out_dir):
  texts, actions = [], set()
  for name in env_names:
    env, params = envs.make(name)
    actions.update(env.action_names(params))
    texts += corpus(name, env, params, jax.device_get(reset_batch(env, params, jnp.arange(200))), 200)
    texts += [prompt.system_text(env.instruction_text(params, config.rollout.max_actions_per_traj)),
              prompt.user_text(0, "", 8, config.rollout.max_new_tokens), "Reward:\n-0.1\n"] * 20
    if config.demo.template_rate and config.demo.template_style == "sentence":  # "reading": a reading's words
      texts += list(TEMPLATES[name]) * 20
  # action names stay tokens of their own, so the answer repeats the reasoning's chosen moves token for token
  return train_tokenizer(texts, config.demo.vocab_size, out_dir, split_words=False, isolated_words=sorted(actions))


def demonstrations(config, env_name, tokenizer):
  """(token ids, loss mask) pairs of solver episodes in the exact rollout layout."""
  env, params = envs.make(env_name)
  rollout = RolloutConfig(**config.rollout.to_dict())
  assets = build_assets(tokenizer, env, params, rollout)
  policy = solver_policy(env, params, tokenizer, rollout.max_new_tokens, rollout.max_actions_per_turn,
                         config.demo.mistake_rate, config.demo.single_move_rate, config.demo.habit_move,
                         seed=config.seed, template_rate=config.demo.template_rate, templates=config.demo.templates,
                         template_style=config.demo.template_style)
  count = config.demo.sft_episodes
  traj = host_rollout(policy, env, params, assets, rollout, np.arange(DEMO_SEED_BASE, DEMO_SEED_BASE + count),
                      np.arange(count), jax.random.PRNGKey(config.seed), seq_len=slot_layout(assets, rollout)[2])
  examples = [(traj.tokens[i][traj.valid[i]].tolist(), traj.loss_mask[i][traj.valid[i]].tolist())
              for i in range(count)]
  return examples, float(np.mean(traj.success))


def format_stages(config, env_names, tokenizer):
  """The first SFT stages, on replies with random moves to the demonstrations' first states: packed
  replies that teach the answer to repeat the reasoning's moves, then observed replies that teach the
  reasoning to read the positions off the observation."""
  states = []
  for name in env_names:
    env, params = envs.make(name)
    names, count = env.action_names(params), config.demo.sft_episodes
    first_states = jax.device_get(reset_batch(env, params, jnp.arange(DEMO_SEED_BASE, DEMO_SEED_BASE + count)))
    for i in range(count):
      state = unbatch(first_states, i)
      states.append((env.render_text(state, params), plan_and_reason(name, state, names)[1], names))
  stages = []
  for observed, steps in ((False, config.demo.copy_steps), (True, config.demo.reading_steps)):
    rows = format_rows(states, tokenizer, observed=observed, rows=steps * config.demo.sft_batch_size,
                       row_len=FORMAT_ROW_LEN, max_moves=config.rollout.max_actions_per_turn, seed=config.seed)
    stages.append((rows, FORMAT_ROW_LEN, steps))
  return stages


def check_settings(config, env_names):
  """Validates the RL settings for each of `env_names` before any work (`trainer.read_settings`)."""
  for name in env_names:
    rl_config = copy.deepcopy(config)
    rl_config.env.name = name
    read_settings(rl_config)


def sft_schedule(config, env_names, kind: str = "demo"):
  """The SFT learning rates of a warm start of `kind` ("pretrained": the demonstrations only; others, the demo's:
  the format stages, then the demonstrations) on `env_names`; ConfigError for settings that cannot work."""
  steps = config.demo.sft_steps + (0 if kind == "pretrained" else config.demo.copy_steps + config.demo.reading_steps)
  try:
    schedule = lr_schedule(config.demo.sft_lr, steps, config.demo.sft_warmup_steps, config.demo.sft_decay_steps)
  except ValueError as error:
    raise config_lib.ConfigError(f"demo.sft_warmup_steps, demo.sft_decay_steps: {error}") from error
  config_lib.check_one_of("demo.template_style", config.demo.template_style, TEMPLATE_STYLES)
  templates = TEMPLATE_STYLES[config.demo.template_style]
  for name in env_names:
    env, params = envs.make(name)
    actions = env.action_names(params)
    if config.demo.habit_move and config.demo.habit_move not in (actions or ()):
      raise config_lib.ConfigError(
          f"demo.habit_move {config.demo.habit_move!r} is not a {name} action "
          + (f"({', '.join(actions)})" if actions else "(its actions are each episode's own: set it to '')"))
    available = len(templates.get(name, ()))
    config_lib.check("demo.templates", not config.demo.template_rate or 1 <= config.demo.templates <= available,
                     f"{name} has {available} {config.demo.template_style} templates (`demonstrations.TEMPLATE_STYLES`)"
                     f" for demo.template_rate {config.demo.template_rate}", config.demo.templates)
  return schedule


def _demonstration_sft(config, env_names, model_config, params, tokenizer, schedule, first_stages, first_what: str):
  """SFT of `params` on `first_stages`, then on solver demonstrations of `env_names`; exports the model with
  `tokenizer` to `<workdir>/sft_model`. Returns (that dir, demo success per env)."""
  n_params = sum(x.size for x in jax.tree.leaves(params))
  examples, demo_success = [], {}
  for name in env_names:
    env_examples, demo_success[name] = demonstrations(config, name, tokenizer)
    examples += env_examples
    log(f"{len(env_examples)} {name} demonstrations (solver with mistakes solves {demo_success[name]:.0%})")
  seq_len = -(-max(len(ids) for ids, _ in examples) // 64) * 64
  log(f"SFT of a {n_params / 1e6:.2f}M-parameter model: {first_what}{config.demo.sft_steps} steps on the "
      f"demonstrations (sequences up to {seq_len} tokens)")
  losses = []
  params, _ = fit(model_config, params, first_stages + [(examples, seq_len, config.demo.sft_steps)],
                  batch_size=config.demo.sft_batch_size, schedule=schedule, seed=config.seed,
                  length_bucket=config.demo.sft_length_bucket,
                  on_step=lambda step, loss: losses.append(loss) if step % 25 == 24 else None,
                  progress=config.logging.progress_bar)
  log("SFT loss every 25 steps: " + ", ".join(f"{float(x):.3f}" for x in losses))
  sft_dir = paths.join(config.workdir, "sft_model")
  export_hf(params, model_config, sft_dir, tokenizer)
  return sft_dir, demo_success


def warm_start(config, env_names):
  """Tokenizer and SFT on solver demonstrations of `env_names`; returns (SFT model dir, tokenizer, demo success)."""
  schedule = sft_schedule(config, env_names)  # bad SFT settings fail before any work
  paths.makedirs(config.workdir)
  log(f"training a tokenizer on {', '.join(env_names)} text")
  tokenizer = build_tokenizer(config, env_names, paths.join(config.workdir, "tokenizer"))
  model_config = scratch_config(tokenizer, hidden_size=config.demo.hidden_size, num_layers=config.demo.num_layers,
                                num_heads=config.demo.num_heads, num_kv_heads=config.demo.num_kv_heads)
  params = init_params(model_config, jax.random.key(config.seed))
  sft_dir, demo_success = _demonstration_sft(
      config, env_names, model_config, params, tokenizer, schedule, format_stages(config, env_names, tokenizer),
      f"{config.demo.copy_steps} + {config.demo.reading_steps} steps on replies with random moves (answers repeat "
      f"them; positions read off the observation), then ")
  return sft_dir, tokenizer, demo_success


def pretrained_warm_start(config, env_names):
  """A format warm start of the pretrained `model.path` ("" the bundled SmolLM2-135M-Instruct) with its own
  tokenizer and chat template: SFT on solver demonstrations of `env_names` only. Returns (SFT model dir,
  tokenizer, demo success)."""
  schedule = sft_schedule(config, env_names, "pretrained")
  paths.makedirs(config.workdir)
  model, tokenizer = load_model(config.model.path, build_mesh(config))
  log(f"format warm start of {config.model.path or 'the bundled SmolLM2-135M-Instruct'}")
  sft_dir, demo_success = _demonstration_sft(config, env_names, model.config, model.params, tokenizer, schedule,
                                             [], "")
  return sft_dir, tokenizer, demo_success


def paired_gain(success_before, success_after) -> tuple[float, float]:
  """Mean per-seed change in success and its standard error (the same validation seeds before and after)."""
  change = np.asarray(success_after, np.float64) - np.asarray(success_before, np.float64)
  return float(change.mean()), float(change.std(ddof=1) / np.sqrt(change.size))


def paired_metrics(before, after, prefix: str) -> dict[str, float]:
  """`rollout_metrics` of the rollout `after` under `prefix`, with `<prefix>/gain` and `<prefix>/gain_se`: the
  `paired_gain` over `before`, a rollout of the same seeds."""
  gain, gain_se = paired_gain(mesh_lib.fetch(before.success), mesh_lib.fetch(after.success))
  return rollout_metrics(after, prefix) | {f"{prefix}/gain": gain, f"{prefix}/gain_se": gain_se}


def reading_metrics(env_name, traj, tokenizer) -> dict[str, float]:
  """`demonstrations.reading_rates` of a validation rollout, as `val/` metrics."""
  host_traj = jax.tree.map(lambda x: np.asarray(mesh_lib.fetch(x)), traj)
  return {f"val/{key}": value for key, value in reading_rates(env_name, host_traj, tokenizer).items()}


def reinforce(config, env_name, sft_dir, workdir, heldout_params: dict | None = None):
  """RL on `env_name` from the SFT model; returns (trainer, validation before RL, final metrics).

  The final metrics hold the validation after RL and `val/gain`, `val/gain_se`: the paired change in
  success over the fixed validation seeds and its standard error. Both validations carry `reading_metrics`:
  how often the reasoning names the observed positions and the answer repeats the reasoning's moves.
  With `heldout_params` (env params, e.g. Bandit's {"name_pool": "test"}), the same seeds are also played with
  those params before and after RL: `heldout/` metrics, with `heldout/gain` and `heldout/gain_se` in the final ones.
  """
  rl_config = copy.deepcopy(config)
  rl_config.env.name = env_name
  rl_config.model.path = sft_dir
  rl_config.workdir = workdir
  if paths.isdir(workdir):  # the demo's own run directory: a fresh RL run replaces the previous demo's
    log(f"{env_name}: replacing the previous demo run in {workdir}")
    paths.remove_tree(workdir)
  trainer = Trainer.create(rl_config)
  before = trainer.validation_rollout()
  start = rollout_metrics(before, "val") | reading_metrics(env_name, before, trainer.exp.tokenizer)
  if heldout_params:
    heldout_config = copy.deepcopy(rl_config)
    with heldout_config.unlocked():  # the command line's config is locked; env params are free-form
      heldout_config.env.params.update(heldout_params)
    heldout = build_source(heldout_config, trainer.settings.rollout, trainer.exp.model, trainer.exp.tokenizer)
    heldout_before = trainer.validation_rollout(heldout)
    start |= rollout_metrics(heldout_before, "heldout")
  log(f"{env_name}: SFT policy validation success {start['val/success']:.3f}; RL for {config.train.iterations} "
      f"iterations ({config.train.env_groups} groups x {config.train.group_size})")
  final = trainer.run()
  trainer.checkpointer.close()
  # The last iteration validated unless RL stopped early.
  after = trainer.last_validation if "val/success" in final else trainer.validation_rollout()
  final |= paired_metrics(before, after, "val") | reading_metrics(env_name, after, trainer.exp.tokenizer)
  log(f"{env_name}: validation success {start['val/success']:.3f} -> {final['val/success']:.3f}, "
      f"gain {final['val/gain']:+.3f} +- {final['val/gain_se']:.3f} (best {trainer.best_val_success:.3f}); "
      f"reasoning names the observed positions in {start['val/positions_read']:.0%} -> "
      f"{final['val/positions_read']:.0%} of turns, the answer repeats its moves in "
      f"{start['val/answer_follows_reasoning']:.0%} -> {final['val/answer_follows_reasoning']:.0%}")
  if heldout_params:
    final |= paired_metrics(heldout_before, trainer.validation_rollout(heldout), "heldout")
    log(f"{env_name}: held-out validation ({heldout_params}) success {start['heldout/success']:.3f} -> "
        f"{final['heldout/success']:.3f}, gain {final['heldout/gain']:+.3f} +- {final['heldout/gain_se']:.3f}")
  return trainer, start, final


def demo_report(workdir: str, env_names, results: dict) -> str:
  """Plots every environment's run and writes `workdir/report.md` with the gains; returns its path."""
  lines = ["| env | solver demos success | after SFT | after RL | gain (± s.e.) | best during RL "
           "| positions read (SFT → RL) | answer repeats reasoning (SFT → RL) |",
           "|---|---|---|---|---|---|---|---|"]
  plots = []
  for name in env_names:
    r = results[name]
    plots.append((name, plot_run(paths.join(workdir, name), f"{name}: SFT warm start + RL with SNR-Aware Filtering",
                                 {"val/success": r["sft_val_success"]})))
    lines.append(f"| {name} | {r['demo_success']:.3f} | {r['sft_val_success']:.3f} | {r['final_val_success']:.3f} | "
                 f"{r['gain']:+.3f} ± {r['gain_se']:.3f} | {r['best_val_success']:.3f} | "
                 + " | ".join(f"{sft:.0%} → {r['reading']['rl'][key]:.0%}" for key, sft in r["reading"]["sft"].items())
                 + " |")
  lines += ["", "Validation: the same fixed seeds before and after RL, one sample each at temperature 0.5; the gain's "
            "standard error is over the per-seed changes in success. Positions read: validation turns whose "
            "reasoning names the observed positions (player and box, or player and goal); answer repeats reasoning: "
            "turns whose answer is the moves after the reasoning's \"So:\".",
            "Metrics per iteration are in `<env>/metrics.jsonl`, TensorBoard files in `<env>/tensorboard` and decoded "
            "validation episodes in `<env>/transcripts.jsonl`."]
  return write_report(workdir, "ragen_jax demo report", lines, plots)
