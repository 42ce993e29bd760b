"""`python -m ragen_jax.demo [--config=configs/demo.py]`: the whole method on CPU.

1. train a tokenizer on environment text; 2. SFT a tiny model on solver
demonstrations; 3. RL with SNR-Aware Filtering and collapse diagnostics on each
environment; 4. a report with plots in the run directory.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging

from ragen_jax import config as config_lib
from ragen_jax import paths
from ragen_jax.demo.demonstrations import READING_KEYS
from ragen_jax.demo.stages import check_settings, demo_report, log, reinforce, warm_start


def rl_result(config, name, sft_dir, demo_success):
  """RL on environment `name` from the warm start, its policy exported; the demo's record of it."""
  trainer, start, final = reinforce(config, name, sft_dir, paths.join(config.workdir, name))
  trainer.export_policy(paths.join(trainer.workdir, "final_model"))
  return {"sft_val_success": start["val/success"], "final_val_success": final["val/success"],
          "gain": final["val/gain"], "gain_se": final["val/gain_se"], "best_val_success": trainer.best_val_success,
          "demo_success": demo_success, "final": final,
          "reading": {stage: {key: metrics[f"val/{key}"] for key in READING_KEYS}
                      for stage, metrics in (("sft", start), ("rl", final))}}


def run(config):
  """The environments' RL runs side by side, a thread each: alone, one keeps about 1.4 of the 2 cores busy at
  these sizes, and one compiles while the other computes. Their results are those of one after the other: the
  runs share no state, XLA's programs compute the same numbers under any load, and their checkpoint saves start
  one at a time (`checkpoint._SAVE_STARTS`)."""
  env_names = config.demo.envs.split(",")
  check_settings(config, env_names)
  sft_dir, _, demo_success = warm_start(config, env_names)
  with concurrent.futures.ThreadPoolExecutor(len(env_names)) as pool:
    futures = {name: pool.submit(rl_result, config, name, sft_dir, demo_success[name]) for name in env_names}
  results = {name: future.result() for name, future in futures.items()}
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
