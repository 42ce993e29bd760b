"""Run reports: PNG plots over iterations and markdown reports (`write_report`; `training_report` for `train`)."""

from __future__ import annotations

import io
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ragen_jax import paths  # noqa: E402
from ragen_jax.report.writer import CONFIG_FILE, read_metrics  # noqa: E402

PANELS = (  # (title, keys drawn on the panel): keys of one panel share a scale
    ("validation success", ("val/success",)),
    ("reward and in-group reward std", ("train/score", "update/in_group_reward_std")),
    ("valid action rate", ("train/valid_action_rate", "val/valid_action_rate")),
    ("SNR filter kept ratio", ("update/filter_kept_ratio",)),
    ("input dependence: MI z-score", ("collapse/trajectory/mi_zscore", "collapse/first_turn/mi_zscore")),
    ("input dependence: retrieval accuracy", ("collapse/trajectory/retrieval_accuracy",
                                              "collapse/trajectory/retrieval_chance_level")),
    ("entropy", ("update/policy_entropy", "collapse/reasoning_token_entropy")),
    ("losses", ("update/pg_loss", "update/kl_loss", "update/value_loss")),
)
SUMMARY_METRICS = ("train/success", "train/score", "val/success", "val/valid_action_rate", "update/filter_kept_ratio",
                   "collapse/trajectory/mi_zscore", "collapse/trajectory/retrieval_accuracy", "update/policy_entropy",
                   "time/iteration_s")
RUN_FILES = (("metrics.jsonl", "every metric of every iteration"),
             ("tensorboard", "the same for TensorBoard, with the transcripts in its text tab"),
             ("transcripts.jsonl", "decoded validation episodes: prompts, replies, parsed actions, rewards"),
             ("parameters.txt", "the model's parameter table"), ("checkpoints", "train state (Orbax)"),
             ("final_model", "the final policy as a Hugging Face directory"),
             ("final_adapters", "the final LoRA adapters alone (PEFT layout)"),
             ("final_metrics.json", "the last iteration's metrics"), (CONFIG_FILE, "the resolved config"),
             ("profile", "traces of `train.profile_steps` for TensorBoard's profile tab"))


def label_iterations(ax) -> None:
  """An x axis of iterations, ticked at whole numbers."""
  ax.set_xlabel("iteration")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def run_figure(rows: list[dict], title: str, baseline: dict[str, float] | None = None):
  """A matplotlib figure with a panel per PANELS entry of metric rows (`read_metrics`; `baseline`: values drawn at
  iteration 0)."""
  steps_logged = [r["step"] for r in rows] + ([0] if baseline else [])
  fig, axes = plt.subplots(2, 4, figsize=(19, 8))
  for ax, (name, keys) in zip(axes.ravel(), PANELS):
    drawn = False
    for key in keys:
      points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
      if baseline and key in baseline:
        points = [(0, baseline[key])] + points
      if points:
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o", markersize=3, label=key)
        drawn = True
    ax.set_title(name)
    label_iterations(ax)
    if steps_logged:  # every panel spans the whole run, so a lone point still gets whole-number ticks
      ax.set_xlim(min(steps_logged) - 0.5, max(steps_logged) + 0.5)
    ax.grid(alpha=0.3)
    if drawn:
      ax.legend(fontsize=7)
    else:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
  fig.suptitle(title)
  fig.tight_layout()
  return fig


def plot_run(run_dir: str, title: str, baseline: dict[str, float] | None = None) -> str:
  """`run_dir/report.png`, the `run_figure` of `run_dir/metrics.jsonl`; returns its path."""
  return save_figure(run_figure(read_metrics(run_dir), title, baseline), paths.join(run_dir, "report.png"))


def save_figure(fig, path: str) -> str:
  """Writes `fig` as a PNG to `path` (local or `gs://`), closes it and returns `path`."""
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=80)
  plt.close(fig)
  paths.write_bytes(path, png.getvalue())
  return path


def write_report(workdir: str, title: str, body: list[str], plots: list[tuple[str, str]]) -> str:
  """Writes `workdir/report.md`: the title, the `body` lines, then each (name, PNG path) plot; returns its path."""
  lines = [f"# {title}", "", *body, ""]
  for name, plot in plots:
    lines += [f"![{name}]({os.path.relpath(plot, paths.join(workdir))})", ""]  # relative links: same on gs://
  path = paths.join(workdir, "report.md")
  paths.write_text(path, "\n".join(lines))
  return path


def metric_table(rows: list[dict], keys=SUMMARY_METRICS) -> list[str]:
  """Markdown table of each of `keys` logged in `rows`: iterations logged, first, last, min and max."""
  lines = ["| metric | iterations logged | first | last | min | max |", "|---|---|---|---|---|---|"]
  for key in keys:
    values = [r[key] for r in rows if r.get(key) is not None and math.isfinite(r[key])]
    if values:
      lines.append(f"| {key} | {len(values)} | " + " | ".join(f"{v:.3g}" for v in (values[0], values[-1], min(values),
                                                                                    max(values))) + " |")
  return lines


def training_report(workdir: str, title: str, description: list[str]) -> str:
  """`report.md` and `report.png` of a training run in `workdir`: `description` lines, the summary of its
  metrics, its files and the plot; returns the report's path."""
  files = [f"- `{name}`: {what}" for name, what in RUN_FILES if paths.exists(paths.join(workdir, name))]
  body = [*description, "", *metric_table(read_metrics(workdir)), "", "Files of the run:", *files]
  return write_report(workdir, title, body, [(title, plot_run(workdir, title))])
