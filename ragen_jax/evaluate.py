"""Evaluate a policy: per-environment success, pass@k, valid-action rate, mean turns.

  python -m ragen_jax.evaluate --config=configs/NAME.py --config.model.path=DIR_OR_RUN/final_model \\
      [--config.evaluate.envs=sokoban,frozenlake] [--config.evaluate.k=4]

Writes `evaluation.json` and `evaluation.md` into the config's workdir.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from absl import logging

from ragen_jax import config as config_lib
from ragen_jax import mesh as mesh_lib
from ragen_jax.assembly import build_experiment, build_mesh, check_model_and_env
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.trainer import TrainConfig
from ragen_jax.trajectories import rollout_metrics


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
  return env_names, RolloutConfig(**config.rollout.to_dict()), TrainConfig(**config.train.to_dict())


def evaluate_env(config, mesh, env_name: str, rollout: RolloutConfig, val: TrainConfig) -> dict[str, float]:
  """The validation seeds of `val`, `evaluate.k` samples each at the validation temperature."""
  exp = build_experiment(config, rollout, mesh, env_name)
  k = config.evaluate.k
  seeds = np.repeat(np.arange(val.val_seed_start, val.val_seed_start + val.val_episodes), k)
  group_ids = np.repeat(np.arange(val.val_episodes), k)
  traj = mesh_lib.fetch(exp.source.run(exp.model.params, seeds, group_ids, jax.random.PRNGKey(config.seed),
                                       split="validation"))
  metrics = {name.split("/", 1)[1]: value for name, value in rollout_metrics(traj, "eval").items()}
  successes = np.asarray(traj.success).reshape(-1, k)
  for kk in sorted({1, k}):
    metrics[f"pass@{kk}"] = pass_at_k(successes, kk)
  return metrics


def markdown_table(results: dict[str, dict[str, float]]) -> str:
  columns = ["success", "pass@1"] + sorted({c for r in results.values() for c in r if c.startswith("pass@")} -
                                          {"pass@1"}) + ["valid_action_rate", "num_turns", "score"]
  lines = ["| env | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
  for env_name, r in results.items():
    lines.append(f"| {env_name} | " + " | ".join(f"{r[c]:.3f}" for c in columns) + " |")
  return "\n".join(lines)


def main(config):
  logging.set_verbosity(logging.WARNING)  # the table, not the checkpoint library's INFO lines
  env_names, rollout, val = read_settings(config)
  mesh = build_mesh(config)
  results = {name: evaluate_env(config, mesh, name, rollout, val) for name in env_names}
  if jax.process_index():  # process 0 writes the results
    return
  os.makedirs(config.workdir, exist_ok=True)
  with open(os.path.join(config.workdir, "evaluation.json"), "w") as f:
    json.dump(results, f, indent=2)
  table = markdown_table(results)
  with open(os.path.join(config.workdir, "evaluation.md"), "w") as f:
    f.write(table + "\n")
  print(table)


if __name__ == "__main__":
  config_lib.run(main)
