"""`python -m ragen_jax.demo.compare [--config=configs/compare.py]`: the demo's RL with and without SNR-Aware Filtering.

One tokenizer and SFT warm start (as in the demo) shared by every run, then RL per (environment,
setting, seed) from that checkpoint. Writes `results.json`, `compare.md` (ours next to RAGEN-2's
reported numbers), `curves.png` and `correlations.png` into the run directory.
"""

from __future__ import annotations

import copy
import json
import logging
import time

import jax

from ragen_jax import config as config_lib
from ragen_jax import paths
from ragen_jax.demo.stages import check_settings, log, reinforce, share_compiled_programs, warm_start
from ragen_jax.report.comparison import (SETTINGS, plot_correlations, plot_curves, run_summary, summarize,
                                         write_comparison)
from ragen_jax.report.writer import read_metrics


def run(config) -> dict:
  """Shared warm start, RL per (env, setting, seed), then the results, plots and table; returns the results."""
  env_names = config.demo.envs.split(",")
  check_settings(config, env_names)
  clock = time.time()
  sft_dir, _, demo_success = warm_start(config, env_names)
  sft_minutes = (time.time() - clock) / 60
  jobs = [(env, setting, seed) for env in env_names for seed in range(config.compare.seeds) for setting in SETTINGS]
  runs, params_m, started = [], None, time.time()
  for i, (env, setting, seed) in enumerate(jobs):
    log(f"run {i + 1}/{len(jobs)}: {env}, {setting}, seed {seed}"
        + (f" ({(time.time() - started) / i * (len(jobs) - i) / 60:.0f} min left)" if i else ""))
    rl_config = copy.deepcopy(config)
    rl_config.seed = config.seed + seed
    rl_config.filter.enabled = SETTINGS[setting]
    trainer, start, final = reinforce(rl_config, env, sft_dir, paths.join(config.workdir, env, setting, str(seed)))
    params_m = sum(x.size for x in jax.tree.leaves(trainer.state.policy)) / 1e6
    runs.append({"env": env, "setting": setting, "seed": seed, "iterations": trainer.iteration,
                 "early_stop": bool(final.get("early_stop", 0.0)), "sft_val_success": start["val/success"],
                 "final_val_success": final["val/success"], "gain": final["val/gain"],
                 "gain_se": final["val/gain_se"], "best_val_success": trainer.best_val_success}
                | run_summary(read_metrics(trainer.workdir), start["val/success"]))
  summary, correlations = summarize(runs, env_names)
  results = {"envs": env_names, "settings": SETTINGS, "demo_success": demo_success,
             "setup": {"algorithm": config.algorithm.preset, "iterations": config.train.iterations,
                       "env_groups": config.train.env_groups, "group_size": config.train.group_size,
                       "seeds": config.compare.seeds, "val_episodes": config.train.val_episodes,
                       "val_temperature": config.rollout.val_temperature, "params_m": params_m,
                       "sft_minutes": sft_minutes, "rl_minutes": (time.time() - started) / 60},
             "summary": summary, "spearman": correlations, "runs": runs}
  paths.write_text(paths.join(config.workdir, "results.json"), json.dumps(results, indent=2))
  plot_curves(paths.join(config.workdir, "curves.png"), runs, env_names)
  plot_correlations(paths.join(config.workdir, "correlations.png"), runs, correlations, env_names)
  report = write_comparison(config.workdir, results)
  log(f"report: {report} (SFT {sft_minutes:.1f} min, RL {results['setup']['rl_minutes']:.1f} min)")
  return results


def main(config):
  logging.getLogger().setLevel(logging.WARNING)
  share_compiled_programs(config)
  run(config)


if __name__ == "__main__":
  config_lib.run(main, default_config="configs/compare.py")
