"""Evaluate a policy: per-environment success, pass@k, valid-action rate, mean turns.

  python -m ragen_jax.evaluate --config=configs/NAME.py --config.model.path=DIR_OR_RUN/final_model \\
      [--config.evaluate.envs=sokoban,frozenlake] [--config.evaluate.k=4]

Prints what it loads and plays and one decoded episode per environment, then the table; writes
`evaluation.json`, `evaluation.md` and `transcripts.jsonl` (the first `train.val_transcripts` episodes of
each environment, decoded: `report.transcripts`) into the config's workdir.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from tqdm.auto import tqdm

from ragen_jax import config as config_lib
from ragen_jax import mesh as mesh_lib
from ragen_jax import paths
from ragen_jax.assembly import build_experiment, build_mesh, check_model_and_env, check_process_split
from ragen_jax.models import lora
from ragen_jax.report.startup import quiet_library_logs, startup_lines
from ragen_jax.report.transcripts import decode_episodes, first_episodes, transcript_text
from ragen_jax.report.writer import TRANSCRIPTS_FILE, dump_json, json_ready, write_jsonl
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.trainer import TrainConfig
from ragen_jax.trajectories import Trajectories, rollout_metrics

EPISODE_PRINT_CHARS = 600  # each prompt and reply of the printed episode is shortened to about this


def pass_at_k(successes_NK: np.ndarray, k: int) -> float:
  """Unbiased pass@k (Chen et al. 2021) from n samples per problem, averaged over problems."""
  n = successes_NK.shape[1]
  correct = successes_NK.sum(1)
  if k > n:
    raise ValueError(f"pass@{k} needs at least {k} samples per problem, have {n}")
  fails = np.array([np.prod(1.0 - k / np.arange(n - c + 1, n + 1)) if n - c >= k else 0.0 for c in correct])
  return float(np.mean(1.0 - fails))


def read_settings(config) -> tuple[list[str], RolloutConfig, TrainConfig]:
  """(environment names, rollout settings, validation seeds' settings), every one validated before any work."""
  env_names = config.evaluate.envs.split(",")
  for name in env_names:
    check_model_and_env(config, name)
  config_lib.check("evaluate.k", config.evaluate.k >= 1, "must be >= 1", config.evaluate.k)
  config_lib.check_workdir(config.workdir)
  return env_names, RolloutConfig(**config.rollout.to_dict()), TrainConfig(**config.train.to_dict())


def evaluate_env(exp, k: int, val: TrainConfig) -> tuple[dict[str, float], Trajectories]:
  """The validation seeds of `val`, `k` samples each at the validation temperature: (metrics, host trajectories)."""
  seeds = np.repeat(val.val_seeds(), k)
  group_ids = np.repeat(np.arange(val.val_episodes), k)
  sampled = lora.merge(exp.model.config, exp.model.params)  # the sampler decodes with LoRA adapters merged
  traj = mesh_lib.fetch(exp.source.run(sampled, seeds, group_ids, jax.random.PRNGKey(exp.config.seed),
                                       split="validation"))
  metrics = {name.split("/", 1)[1]: value for name, value in rollout_metrics(traj, "eval").items()}
  successes = np.asarray(traj.success).reshape(-1, k)
  for kk in sorted({1, k}):
    metrics[f"pass@{kk}"] = pass_at_k(successes, kk)
  return metrics, traj


def markdown_table(results: dict[str, dict[str, float]]) -> str:
  columns = ["success", "pass@1"] + sorted({c for r in results.values() for c in r if c.startswith("pass@")} -
                                          {"pass@1"}) + ["valid_action_rate", "num_turns", "score"]
  lines = ["| env | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
  for env_name, r in results.items():
    lines.append(f"| {env_name} | " + " | ".join(f"{r[c]:.3f}" for c in columns) + " |")
  return "\n".join(lines)


def main(config):
  quiet_library_logs()  # the table, not the checkpoint library's INFO lines
  env_names, rollout, val = read_settings(config)
  mesh = build_mesh(config)
  is_main, k = jax.process_index() == 0, config.evaluate.k
  check_process_split(mesh, f"train.val_episodes={val.val_episodes} x evaluate.k={k}", val.val_episodes * k)
  say = tqdm.write if is_main else lambda line: None
  progress = tqdm(env_names, desc="evaluate", unit="env", disable=not (config.logging.progress_bar and is_main))
  results, transcripts = {}, []
  for name in progress:
    progress.set_postfix_str(name)
    say(f"{name}: loading the model and building the environment")
    exp = build_experiment(config, rollout, mesh, name)
    if not results:
      for line in startup_lines(exp):
        say(line)
    say(f"{name}: compiling the rollout, then playing {val.val_episodes} seeds x {k} sample(s)")
    start = time.perf_counter()
    results[name], traj = evaluate_env(exp, k, val)
    say(f"{name}: success {results[name]['success']:.3f} ({time.perf_counter() - start:.0f} s)")
    count = min(val.val_transcripts, len(traj.success))
    if is_main and count:
      records = decode_episodes(exp.source, exp.tokenizer, first_episodes(traj, count),
                                np.repeat(val.val_seeds(), k)[:count])
      transcripts += [{"env": name, **record} for record in records]
      say(f"{name}, first episode (every prompt in transcripts.jsonl): "
          f"{transcript_text(records[0], compact=True, max_chars=EPISODE_PRINT_CHARS)}")
  if not is_main:  # process 0 writes the results
    return
  dump_json({name: json_ready(metrics) for name, metrics in results.items()},
            paths.join(config.workdir, "evaluation.json"))
  if transcripts:
    write_jsonl(paths.join(config.workdir, TRANSCRIPTS_FILE), transcripts, mode="w")
  table = markdown_table(results)
  paths.write_text(paths.join(config.workdir, "evaluation.md"), table + "\n")
  print(table)


if __name__ == "__main__":
  config_lib.run(main)
