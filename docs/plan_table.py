"""The table of docs/scale_out.md: the plan command's verdicts for the paper setting on common slices.

  .venv/bin/python docs/plan_table.py [--sizes qwen2.5-0.5b,...,qwen2.5-7b] [--algorithms ppo,grpo] [--out plans.jsonl]
  .venv/bin/python docs/plan_table.py --table plans.jsonl   # the markdown table of the rows planned so far

For each model shape, algorithm (`configs/paper/main_table.py:sokoban,ppo` with its critic, and `...,grpo`) and
training mode (full fine-tuning, or LoRA rank 64 on every projection over a bfloat16 frozen base, which the
bfloat16 compute reads the same), `planning.plan` compiles one iteration for 4, 8 and 16 fake CPU devices (all on
fsdp, as the preset sets); the per-device peak then decides each slice, and the FLOPs give the ideal iteration time
at the chips' peak. One process plans every device count (the plan uses the first N devices); each row is
appended to `--out` as it is done (a 2-core machine takes about a minute a plan).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ragen_jax import planning  # noqa: E402
from ragen_jax.models.shapes import SHAPES  # noqa: E402

SLICES = (("v5e-8", "v5e", 8), ("v5e-16", "v5e", 16), ("v6e-8", "v6e", 8), ("v4-8", "v4", 4), ("v5p-8", "v5p", 4),
          ("8xH100", "h100", 8))  # (name, chip, chips = JAX devices: v4-8 and v5p-8 count TensorCores, 2 per chip)
MODES = {"full": {}, "LoRA r64": {"model.lora.rank": 64, "model.param_dtype": "bfloat16"}}


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--sizes", default="qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b")
  parser.add_argument("--algorithms", default="ppo,grpo")
  parser.add_argument("--modes", default=",".join(MODES))
  parser.add_argument("--out", default="plans.jsonl")
  parser.add_argument("--table", default="", help="print the markdown table of this file's rows and stop")
  args = parser.parse_args()
  if args.table:
    with open(args.table) as f:
      print(markdown([json.loads(line) for line in f if line.strip()]))
    return
  counts = sorted({n for _, _, n in SLICES})
  planning.use_cpu_devices(max(counts))
  from configs.paper import main_table  # noqa: E402 (after the backend has its devices)

  for size in args.sizes.split(","):
    for algorithm in args.algorithms.split(","):
      for mode in args.modes.split(","):
        config = main_table.get_config(f"sokoban,{algorithm}")
        config.model.path = size
        peaks, flops = {}, None
        for count in counts:
          start = time.perf_counter()
          plan = planning.plan(config, planning.PlanConfig(devices=count, fit=False), MODES[mode])
          peaks[count], flops = plan.peak, plan.iteration_flops
          print(f"{size} {algorithm} {mode} {count} devices: peak {plan.peak / planning.GIB:.2f} GiB, "
                f"{plan.iteration_flops:.3g} FLOPs ({time.perf_counter() - start:.0f} s)", flush=True)
        with open(args.out, "a") as f:
          f.write(json.dumps({"model": size, "algorithm": algorithm, "mode": mode, "peaks": peaks, "flops": flops})
                  + "\n")


def markdown(rows) -> str:
  """One line per (model, algorithm, mode): per slice, fits or not with the peak GiB per device, then the ideal
  iteration time at the slice's peak FLOP/s."""
  head = "| model | algorithm | training | FLOPs / iteration | " + " | ".join(
      f"{name} ({planning.CHIPS[chip].hbm_gib:g} GiB)" for name, chip, _ in SLICES) + " |"
  lines = [head, "|" + "---|" * (4 + len(SLICES))]
  order = list(SHAPES)
  for row in sorted(rows, key=lambda r: (order.index(r["model"]), r["algorithm"] != "ppo", r["mode"] != "full")):
    cells = []
    for _, chip, count in SLICES:
      peak = row["peaks"][str(count)] / planning.GIB  # JSON keys are text
      fits = peak <= planning.CHIPS[chip].hbm_gib
      seconds = row["flops"] / (count * planning.CHIPS[chip].peak_tflops * 1e12)
      cells.append(f"{'fits' if fits else '**no**'} {peak:.1f}, {seconds:.0f} s")
    lines.append(f"| {row['model']} | {row['algorithm']} | {row['mode']} | {row['flops']:.2g} | " + " | ".join(cells)
                 + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
