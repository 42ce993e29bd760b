"""Plan entry point: does a training config fit a slice, and how fast could one iteration be (`planning`).

  python -m ragen_jax.plan --config=configs/paper/main_table.py:sokoban,ppo \\
      --config.model.path=qwen2.5-3b --plan.devices=16 --plan.chip=v5e [--plan.json=plan.json]

`model.path`: a built-in shape (`models.shapes`) or a local HF directory (only config.json is read). Nothing is
downloaded or allocated: the programs are compiled for fake CPU devices, and the numbers are the compiler's plan.
"""

from __future__ import annotations

import dataclasses
import json
import time

import ml_collections
from ml_collections import config_flags

from ragen_jax import config as config_lib
from ragen_jax import paths, planning

PLAN = config_flags.DEFINE_config_dict("plan", ml_collections.ConfigDict(dataclasses.asdict(planning.PlanConfig())))


def main(config):
  plan_config = planning.PlanConfig(**PLAN.value.to_dict())
  planning.use_cpu_devices(plan_config.devices * 4 if plan_config.fit else plan_config.devices)
  start = time.perf_counter()
  result = planning.plan_and_fit(config, plan_config)
  print("\n".join(result.lines()))
  print(f"(planned in {time.perf_counter() - start:.0f} s)")
  if plan_config.json:
    paths.write_text(plan_config.json, json.dumps(result.to_dict(), indent=1))


if __name__ == "__main__":
  config_lib.run(main)
