"""`python -m ragen_jax.demo [--config=configs/demo.py]`: the whole method on CPU.

1. train a tokenizer on environment text; 2. SFT a tiny model on solver
demonstrations; 3. RL with SNR-Aware Filtering and collapse diagnostics on each
environment; 4. a report with plots in the run directory.
"""

from __future__ import annotations

import json
import logging

from ragen_jax import config as config_lib
from ragen_jax import paths
from ragen_jax.demo.demonstrations import READING_KEYS
from ragen_jax.demo.stages import check_settings, demo_report, log, reinforce, warm_start


def run(config):
  env_names = config.demo.envs.split(",")
  check_settings(config, env_names)
  sft_dir, _, demo_success = warm_start(config, env_names)
  results = {}
  for name in env_names:
    trainer, start, final = reinforce(config, name, sft_dir, paths.join(config.workdir, name))
    trainer.export_policy(paths.join(trainer.workdir, "final_model"))
    results[name] = {"sft_val_success": start["val/success"], "final_val_success": final["val/success"],
                     "gain": final["val/gain"], "gain_se": final["val/gain_se"],
                     "best_val_success": trainer.best_val_success, "demo_success": demo_success[name],
                     "reading": {stage: {key: metrics[f"val/{key}"] for key in READING_KEYS}
                                 for stage, metrics in (("sft", start), ("rl", final))},
                     "final": final}
  paths.write_text(paths.join(config.workdir, "results.json"), json.dumps(results, indent=2))
  report = demo_report(config.workdir, env_names, results)
  log(f"report: {report}")
  for name, r in results.items():
    print(f"{name:>10s}: validation success after SFT {r['sft_val_success']:.3f} -> after RL "
          f"{r['final_val_success']:.3f} (gain {r['gain']:+.3f} +- {r['gain_se']:.3f}, paired standard error "
          f"over {config.train.val_episodes} validation seeds)")
  return results


def main(config):
  logging.getLogger().setLevel(logging.WARNING)
  run(config)


if __name__ == "__main__":
  config_lib.run(main, default_config="configs/demo.py")
