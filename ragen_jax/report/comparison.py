"""Runs with and without SNR-Aware Filtering side by side: curves, correlations and a table against RAGEN-2."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from ragen_jax import paths  # noqa: E402
from ragen_jax.report.summary import label_iterations, save_figure  # noqa: E402

CURVES = (("validation success", "val/success"), ("trajectory MI z-score", "collapse/trajectory/mi_zscore"),
          ("policy entropy", "update/policy_entropy"), ("SNR filter kept ratio", "update/filter_kept_ratio"))
PREDICTORS = (("trajectory MI z-score", "mi_zscore"), ("policy entropy", "policy_entropy"))
SETTINGS = {"no_filter": False, "snr_filter": True}  # name -> filter.enabled
COLORS = {"no_filter": "tab:orange", "snr_filter": "tab:blue"}
# SPEC §7 (Qwen2.5-3B, 8 groups x 16, rho 0.9, 400 iterations; unverified): peak validation success in %.
PAPER_PEAK = {"sokoban": {"ppo": (12.9, 28.9), "grpo": (12.1, 21.1)}, "frozenlake": {"ppo": (67.0, 77.9)}}
PAPER_SPEARMAN = {"mi_zscore": "+0.39", "policy_entropy": "-0.11 to -0.14"}
PAPER_STEP_TIME = "-26% to -41%"


def spearman(x, y) -> float:
  """Spearman rank correlation over the pairs where both are finite (ties get their mean rank); nan if undefined."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  finite = np.isfinite(x) & np.isfinite(y)
  rx, ry = stats.rankdata(x[finite]), stats.rankdata(y[finite])
  if rx.size < 2 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
    return math.nan
  return float(np.corrcoef(rx, ry)[0, 1])


def _mean(values) -> float | None:
  values = [v for v in values if v is not None and math.isfinite(v)]
  return float(np.mean(values)) if values else None


def run_summary(rows: list[dict], sft_val_success: float, panels=CURVES) -> dict:
  """Curves of `panels` (validation starting at the SFT policy at step 0) and per-run means of one run's metrics."""
  curves = {key: [[r["step"], r[key]] for r in rows if r.get(key) is not None] for _, key in panels}
  curves["val/success"].insert(0, [0, sft_val_success])
  return {"curves": curves,
          "mi_zscore": _mean(r.get("collapse/trajectory/mi_zscore") for r in rows),
          "policy_entropy": _mean(r.get("update/policy_entropy") for r in rows),
          "kept_ratio": _mean(r.get("update/filter_kept_ratio") for r in rows),
          "iteration_s": _mean(r.get("time/iteration_s") for r in rows[1:]),  # the first one compiles
          "update_s": _mean(r.get("time/update_s") for r in rows[1:])}


def _stats(values) -> dict[str, float] | None:
  values = [v for v in values if v is not None]
  return {"mean": float(np.mean(values)), "std": float(np.std(values))} if values else None


def _rho(value: float) -> float | None:
  return None if math.isnan(value) else value


def _rho_text(value: float | None, runs: int) -> str:
  return f"{value:+.2f} (n={runs})" if value is not None else f"undefined (n={runs}; a constant side)"


def summarize(runs: list[dict], env_names) -> tuple[dict, dict]:
  """Per env and setting: mean and std over seeds; per env: Spearman of each predictor against final success."""
  summary, correlations = {}, {}
  for env in env_names:
    env_runs = [r for r in runs if r["env"] == env]
    summary[env] = {s: {"runs": len(rs)} | {k: _stats(r[k] for r in rs) for k in (
        "sft_val_success", "final_val_success", "best_val_success", "mi_zscore", "policy_entropy", "kept_ratio",
        "iteration_s", "update_s")} for s in SETTINGS if (rs := [r for r in env_runs if r["setting"] == s])}
    finals = [r["final_val_success"] for r in env_runs]
    correlations[env] = {k: _rho(spearman([math.nan if r[k] is None else r[k] for r in env_runs], finals))
                         for _, k in PREDICTORS} | {"runs": len(env_runs)}
  return summary, correlations


def plot_curves(path: str, runs: list[dict], env_names, panels=CURVES) -> str:
  """Rows: `panels`; columns: environments; per setting the mean over seeds with a ±1 std band and thin seed lines
  (filter off and on in `COLORS`, then any other setting of `runs`)."""
  fig, axes = plt.subplots(len(panels), len(env_names), figsize=(6 * len(env_names), 3.2 * len(panels)),
                           squeeze=False)
  others = [s for s in dict.fromkeys(r["setting"] for r in runs) if s not in COLORS]
  colors = COLORS | {setting: f"C{i + 2}" for i, setting in enumerate(others)}  # C0, C1: the COLORS
  for col, env in enumerate(env_names):
    for row, (title, key) in enumerate(panels):
      ax = axes[row, col]
      for setting, color in colors.items():
        curves = [dict(map(tuple, r["curves"][key])) for r in runs
                  if r["env"] == env and r["setting"] == setting and r["curves"].get(key)]
        for curve in curves:
          ax.plot(list(curve), list(curve.values()), color=color, alpha=0.25, linewidth=0.8)
        steps = sorted({s for c in curves for s in c})
        if not steps:
          continue
        values = [[c[s] for c in curves if s in c] for s in steps]
        mean, std = np.array([np.mean(v) for v in values]), np.array([np.std(v) for v in values])
        ax.plot(steps, mean, color=color, marker="o", markersize=3, label=f"{setting} (n={len(curves)})")
        ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.2)
      ax.set_title(f"{env}: {title}")
      label_iterations(ax)
      ax.grid(alpha=0.3)
      if ax.get_legend_handles_labels()[0]:  # a panel no run logged (e.g. MI of a run without diagnostics) has none
        ax.legend(fontsize=7)
  return _save(fig, path)


def plot_correlations(path: str, runs: list[dict], correlations: dict, env_names) -> str:
  """Per environment, final validation success against each run's mean MI z-score and mean policy entropy."""
  fig, axes = plt.subplots(len(env_names), len(PREDICTORS), figsize=(5.5 * len(PREDICTORS), 4 * len(env_names)),
                           squeeze=False)
  for row, env in enumerate(env_names):
    for col, (label, key) in enumerate(PREDICTORS):
      ax = axes[row, col]
      for setting, color in COLORS.items():
        points = [(r[key], r["final_val_success"]) for r in runs
                  if r["env"] == env and r["setting"] == setting and r[key] is not None]
        if points:
          ax.scatter(*zip(*points), color=color, label=setting, s=30)
      ax.set_title(f"{env}: Spearman {_rho_text(correlations[env][key], correlations[env]['runs'])}")
      ax.set_xlabel(f"{label} (mean over the run)")
      ax.set_ylabel("final validation success")
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7)
  return _save(fig, path)


def _fmt(stat, scale: float = 1.0, digits: int = 3) -> str:
  return "-" if stat is None else f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f}"


def write_comparison(workdir: str, results: dict) -> str:
  """`workdir/compare.md`: our runs per setting, then ours next to RAGEN-2's reported numbers; returns its path."""
  env_names, setup = results["envs"], results["setup"]
  summary, correlations = results["summary"], results["spearman"]
  algo = setup["algorithm"]
  lines = ["# SNR-Aware Filtering on and off", "",
           f"Ours: {setup['params_m']:.2f}M-parameter model warm-started once by SFT, then {algo.upper()} for "
           f"{setup['iterations']} iterations of {setup['env_groups']} groups x {setup['group_size']} episodes, "
           f"{setup['seeds']} seeds per setting; validation success on {setup['val_episodes']} fixed seeds "
           f"(temperature {setup['val_temperature']}). Mean ± std over seeds.", "",
           "| env | setting | runs | after SFT | final | peak during RL | MI z-score | policy entropy | kept ratio | "
           "s / iteration | s / update |", "|---" * 11 + "|"]
  for env in env_names:
    for s, r in summary[env].items():
      lines.append(f"| {env} | {s} | {r['runs']} | {_fmt(r['sft_val_success'])} | {_fmt(r['final_val_success'])} | "
                   f"{_fmt(r['best_val_success'])} | {_fmt(r['mi_zscore'], digits=2)} | "
                   f"{_fmt(r['policy_entropy'])} | {_fmt(r['kept_ratio'], digits=2)} | "
                   f"{_fmt(r['iteration_s'], digits=2)} | {_fmt(r['update_s'], digits=2)} |")
  lines += ["", "MI z-score, policy entropy, kept ratio and times are means over each run's iterations "
            "(times without the first, compiling, iteration).", "",
            "## Against RAGEN-2 (different scale: not comparable in value, only in direction)", "",
            "RAGEN-2 (SPEC §7, unverified): Qwen2.5-3B, 8 groups x 16, rho 0.9, 400 iterations. "
            f"Ours: the tiny model above, {setup['iterations']} iterations, {algo.upper()}.", "",
            "| env | quantity | RAGEN-2 | ours |", "|---|---|---|---|"]
  off, on = SETTINGS
  for env in env_names:
    ours = summary[env]
    peak, time_change = "-", "-"
    if off in ours and on in ours:
      peak = f"{ours[off]['best_val_success']['mean'] * 100:.1f} → {ours[on]['best_val_success']['mean'] * 100:.1f}"
      if ours[on]["iteration_s"] and ours[off]["iteration_s"]:
        time_change = f"{ours[on]['iteration_s']['mean'] / ours[off]['iteration_s']['mean'] - 1:+.0%}"
    paper = "; ".join(f"{a} → {b} ({name.upper()})" for name, (a, b) in PAPER_PEAK.get(env, {}).items())
    lines.append(f"| {env} | peak validation success %, {off} → {on} | {paper or 'not reported'} | "
                 f"{peak} ({algo.upper()}) |")
    for label, key in PREDICTORS:
      lines.append(f"| {env} | Spearman({label}, final success) | {PAPER_SPEARMAN[key]} | "
                   f"{_rho_text(correlations[env][key], correlations[env]['runs'])} |")
    lines.append(f"| {env} | iteration time, {on} vs {off} | {PAPER_STEP_TIME} | {time_change} |")
  lines += ["", "RAGEN-2's correlations are across its runs and tasks; ours are across the runs of one environment "
            "here (both settings), so with a handful of runs they are very noisy.", "",
            "![validation success, MI z-score, entropy and kept ratio over iterations](curves.png)", "",
            "![final success against MI z-score and entropy](correlations.png)"]
  path = paths.join(workdir, "compare.md")
  paths.write_text(path, "\n".join(lines) + "\n")
  return path


def _save(fig, path: str) -> str:
  fig.tight_layout()
  return save_figure(fig, path)
