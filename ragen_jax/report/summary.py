"""Run reports: PNG plots over iterations and a markdown table of the results."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ragen_jax.report.writer import read_metrics  # noqa: E402

PANELS = (
    ("validation success", ("val/success",)),
    ("reward and in-group reward std", ("train/score", "update/in_group_reward_std")),
    ("SNR filter kept ratio", ("update/filter_kept_ratio",)),
    ("input dependence (MI)", ("collapse/trajectory/mi_zscore", "collapse/first_turn/mi_zscore",
                               "collapse/trajectory/retrieval_accuracy")),
    ("entropy", ("update/policy_entropy", "collapse/reasoning_token_entropy")),
    ("losses", ("update/pg_loss", "update/kl_loss", "update/value_loss")),
)


def plot_run(run_dir: str, title: str, baseline: dict[str, float] | None = None) -> str:
  """One PNG with a panel per PANELS entry from `run_dir/metrics.jsonl`; returns its path."""
  rows = read_metrics(run_dir)
  fig, axes = plt.subplots(2, 3, figsize=(15, 8))
  for ax, (name, keys) in zip(axes.ravel(), PANELS):
    drawn = False
    for key in keys:
      points = [(r["step"], r[key]) for r in rows if key in r]
      if baseline and key in baseline:
        points = [(0, baseline[key])] + points
      if points:
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o", markersize=3, label=key.split("/", 1)[-1])
        drawn = True
    ax.set_title(name)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    if drawn:
      ax.legend(fontsize=7)
    else:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
  fig.suptitle(title)
  fig.tight_layout()
  path = os.path.join(run_dir, "report.png")
  fig.savefig(path, dpi=80)
  plt.close(fig)
  return path


def write_report(workdir: str, env_names, results: dict) -> str:
  """Plots every environment's run and writes `workdir/report.md`; returns its path."""
  lines = ["# ragen_jax demo report", "",
           "| env | solver demos success | after SFT | after RL | gain (± s.e.) | best during RL "
           "| positions read (SFT → RL) | answer repeats reasoning (SFT → RL) |",
           "|---|---|---|---|---|---|---|---|"]
  plots = []
  for name in env_names:
    r = results[name]
    plots.append((name, plot_run(os.path.join(workdir, name), f"{name}: SFT warm start + RL with SNR-Aware Filtering",
                                 {"val/success": r["sft_val_success"]})))
    lines.append(f"| {name} | {r['demo_success']:.3f} | {r['sft_val_success']:.3f} | {r['final_val_success']:.3f} | "
                 f"{r['gain']:+.3f} ± {r['gain_se']:.3f} | {r['best_val_success']:.3f} | "
                 + " | ".join(f"{sft:.0%} → {r['reading']['rl'][key]:.0%}" for key, sft in r["reading"]["sft"].items())
                 + " |")
  lines += ["", "Validation: the same fixed seeds before and after RL, one sample each at temperature 0.5; the gain's "
            "standard error is over the per-seed changes in success. Positions read: validation turns whose "
            "reasoning names the observed positions (player and box, or player and goal); answer repeats reasoning: "
            "turns whose answer is the moves after the reasoning's \"So:\".",
            "Metrics per iteration are in `<env>/metrics.jsonl` and TensorBoard files in `<env>/tensorboard`.", ""]
  for name, plot in plots:
    lines += [f"![{name}]({os.path.relpath(plot, workdir)})", ""]
  path = os.path.join(workdir, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path
