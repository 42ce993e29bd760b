"""A sub-study's results from its run summaries: `<study>/results.json`, `<study>/report.md` and its PNGs."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ragen_jax import paths  # noqa: E402
from ragen_jax.report.comparison import CURVES, PAPER_PEAK, PAPER_SPEARMAN, SETTINGS, plot_curves  # noqa: E402
from ragen_jax.report.summary import save_figure, write_report  # noqa: E402
from ragen_jax.study.stats import mean_se, paired_test, spearman_ci  # noqa: E402

STUDY_CURVES = CURVES + (("trajectory retrieval accuracy", "collapse/trajectory/retrieval_accuracy"),)
PREDICTORS = (("final MI z-score", "final_mi_zscore", PAPER_SPEARMAN["mi_zscore"]),
              ("final retrieval accuracy", "final_retrieval_accuracy", "not reported"),
              ("final policy entropy", "final_policy_entropy", PAPER_SPEARMAN["policy_entropy"]))
HEALTHY_SE = 2.0  # a run is healthy unless its success fell by more than this many standard errors
MI_KEY, RETRIEVAL_KEY, ENTROPY_KEY = ("collapse/trajectory/mi_zscore", "collapse/trajectory/retrieval_accuracy",
                                     "update/policy_entropy")


def _ms(stat: dict, digits: int = 3, sign: str = "") -> str:
  if stat["mean"] is None:
    return "-"
  return f"{stat['mean']:{sign}.{digits}f}" + ("" if stat["se"] is None else f" ± {stat['se']:.{digits}f}")


def _num(value, digits: int = 3, sign: str = "") -> str:
  return "-" if value is None else f"{value:{sign}.{digits}f}"


def filter_results(records: list[dict]) -> tuple[dict, list[str], list[tuple[str, str]]]:
  """Per env and setting the means with standard errors, per seed the gains, and the paired on-off tests."""
  off, on = SETTINGS
  env_names = list(dict.fromkeys(r["env"] for r in records))
  summary, lines = {}, ["| env | setting | runs | final success | peak success | gain over warm start | "
                        "kept ratio | s / iteration |", "|---" * 8 + "|"]
  seed_lines = [f"| env | seed | gain, {off} | gain, {on} |", "|---|---|---|---|"]
  test_lines = [f"| env | quantity | pairs | {on} − {off} | paired t (p) | Wilcoxon (p) |", "|---" * 6 + "|"]
  for env in env_names:
    by_setting = {s: {r["seed"]: r for r in records if r["env"] == env and r["setting"] == s} for s in SETTINGS}
    summary[env] = {s: {k: mean_se(r[k] for r in rs.values()) for k in (
        "final_val_success", "best_val_success", "gain", "kept_ratio", "iteration_s")} for s, rs in by_setting.items()}
    for s, stat in summary[env].items():
      lines.append(f"| {env} | {s} | {stat['final_val_success']['n']} | {_ms(stat['final_val_success'])} | "
                   f"{_ms(stat['best_val_success'])} | {_ms(stat['gain'], sign='+')} | {_ms(stat['kept_ratio'], 2)} | "
                   f"{_ms(stat['iteration_s'], 2)} |")
    for seed in sorted(set(by_setting[off]) | set(by_setting[on])):
      gains = [f"{r['gain']:+.3f} ± {r['gain_se']:.3f}" if (r := by_setting[s].get(seed)) else "-" for s in SETTINGS]
      seed_lines.append(f"| {env} | {seed} | {' | '.join(gains)} |")
    seeds = sorted(set(by_setting[off]) & set(by_setting[on]))
    summary[env]["paired"] = {}
    for label, key in (("final success", "final_val_success"), ("peak success", "best_val_success"),
                       ("s / iteration", "iteration_s")):
      test = paired_test([by_setting[on][s][key] for s in seeds], [by_setting[off][s][key] for s in seeds])
      summary[env]["paired"][key] = test
      test_lines.append(f"| {env} | {label} | {test['n']} | {_ms(test, sign='+')} | {_num(test['t'], 2, '+')} "
                        f"({_num(test['t_p'])}) | {_num(test['wilcoxon'], 1)} ({_num(test['wilcoxon_p'])}) |")
  paper = "; ".join(f"{env} {a} → {b} ({name.upper()})" for env, algos in PAPER_PEAK.items()
                    for name, (a, b) in algos.items())
  body = (lines + ["", "Mean ± standard error over RL seeds; gain over warm start: each run's paired change in "
                   "validation success over the fixed validation seeds. RAGEN-2's peak success %, no filter → "
                   f"filter (SPEC §7, at its scale): {paper}.", "", "Per seed: gain over the warm start ± its paired "
                   "standard error.", "", *seed_lines, "", f"Paired over RL seeds, {on} against {off}:", "",
                   *test_lines])
  return summary, body, [("curves.png", "validation success, MI z-score, entropy and kept ratio over iterations")]


def correlation_results(records: list[dict], resamples: int, seed: int) -> tuple[dict, list[str], list]:
  """Spearman of final success with each predictor, its bootstrap 95% interval, and a table of the runs."""
  finals = [r["final_val_success"] for r in records]
  summary = {key: spearman_ci([r[key] for r in records], finals, resamples, seed) for _, key, _ in PREDICTORS}
  lines = ["| metric | runs | Spearman with final success | bootstrap 95% interval | RAGEN-2 |", "|---" * 5 + "|"]
  for label, key, paper in PREDICTORS:
    s = summary[key]
    lines.append(f"| {label} | {s['n']} | {_num(s['rho'], 2, '+')} | [{_num(s['low'], 2, '+')}, "
                 f"{_num(s['high'], 2, '+')}] | {paper} |")
  lines += ["", f"Intervals: percentile bootstrap over the runs ({resamples} resamples).", "",
            "| run | final success | final MI z-score | final retrieval accuracy (chance) | final policy entropy |",
            "|---|---|---|---|---|"]
  for r in records:
    lines.append(f"| {r['name']} | {r['final_val_success']:.3f} | {_num(r['final_mi_zscore'], 2)} | "
                 f"{_num(r['final_retrieval_accuracy'])} ({_num(r['final_retrieval_chance'])}) | "
                 f"{_num(r['final_policy_entropy'])} |")
  return summary, lines, [(f"{key}.png", f"final success against {label}") for label, key, _ in PREDICTORS]


def collapse_timing(record: dict) -> dict:
  """When the alarm first fired, when the MI z-score's fall began (its highest point before) and the delay."""
  mi = record["curves"][MI_KEY]
  first = record["alarm_steps"][0] if record["alarm_steps"] else None
  before = [(z, step) for step, z in mi if first is None or step <= first]
  onset = max(before)[1] if before else None
  return {"first_alarm": first, "mi_fall_start": onset,
          "delay": None if first is None or onset is None else first - onset}


def _first_last(record: dict, key: str) -> tuple:
  values = [v for _, v in record["curves"][key]]
  return (values[0], values[-1]) if values else (None, None)


def collapse_results(records: list[dict], others: list[dict]) -> tuple[dict, list[str], list]:
  """Per run: the reasoning's share of turns that read the observation, the alarm's timing, MI, retrieval and
  entropy first → last; the false alarms on healthy `others`."""
  runs, lines = {}, ["| run | final success | positions read (SFT → RL) | alarm fired at | MI peak (fall began) | "
                     "delay | MI z-score | retrieval accuracy (chance) | entropy change |", "|---" * 9 + "|"]
  for r in records:
    read = r.get("positions_read")  # older records have none
    (z0, z1), (a0, a1), (h0, h1) = (_first_last(r, k) for k in (MI_KEY, RETRIEVAL_KEY, ENTROPY_KEY))
    change = None if h0 is None or not h0 else h1 / h0 - 1
    runs[r["name"]] = collapse_timing(r) | {"entropy_change": change}
    t = runs[r["name"]]
    lines.append(f"| {r['name']} | {r['final_val_success']:.3f} | "
                 f"{'-' if read is None else f'{read[0]:.0%} → {read[1]:.0%}'} | {_num(t['first_alarm'], 0)} | "
                 f"{_num(t['mi_fall_start'], 0)} | {_num(t['delay'], 0)} | {_num(z0, 2)} → {_num(z1, 2)} | "
                 f"{_num(a0)} → {_num(a1)} ({_num(r['final_retrieval_chance'])}) | "
                 f"{'-' if change is None else f'{change:+.0%}'} |")
  fired = {s: {"fired": sum(bool(r["alarm_steps"]) for r in records if r["setting"] == s),
               "runs": sum(r["setting"] == s for r in records)} for s in dict.fromkeys(r["setting"] for r in records)}
  healthy = [r for r in others if r["gain"] >= -HEALTHY_SE * r["gain_se"]]
  false_alarms = {"healthy_runs": len(healthy), "runs_with_alarm": sum(bool(r["alarm_steps"]) for r in healthy),
                  "alarms": sum(len(r["alarm_steps"]) for r in healthy)}
  counts = ", ".join(f"{n['fired']} of {n['runs']} {s} runs" for s, n in fired.items())
  lines += ["", f"The alarm fired in {counts}.", "",
            "Positions read: validation turns whose reasoning names the observed positions (the others reason with "
            "a template or misread); alarm fired at: first iteration with `collapse/alarm`; MI peak: the iteration "
            "of the highest logged MI z-score up to then (the fall began there), delay: iterations between the two; "
            "entropy change: last logged policy entropy against the first (RAGEN-2: template collapse leaves it "
            "steady; the alarm's band is `diagnostics.alarm_entropy_tolerance`).",
            "",
            f"False alarms on the healthy runs of the other sub-studies (success not down by more than {HEALTHY_SE:g} "
            f"s.e.): {false_alarms['runs_with_alarm']} of {false_alarms['healthy_runs']} runs, "
            f"{false_alarms['alarms']} alarm iterations in all."]
  return {"runs": runs, "fired": fired, "false_alarms": false_alarms}, lines, [
      ("curves.png", "validation success, MI z-score, entropy, kept ratio and retrieval accuracy over iterations")]


def _heldout_cell(record: dict) -> str:
  heldout = record.get("heldout")
  if not heldout:
    return "-"
  return (f"{heldout['sft_val_success']:.3f} → {heldout['final_val_success']:.3f} "
          f"({heldout['gain']:+.3f} ± {heldout['gain_se']:.3f})")


def pretrained_results(records: list[dict]) -> tuple[dict, list[str], list]:
  """Per run: success after the format warm start and after RL, the paired gain in standard errors, the held-out
  validation's success before → after RL (`studies.HELDOUT_PARAMS`), and the MI diagnostics of the model's
  reasoning first → last."""
  runs, lines = {}, ["| run | after SFT | after RL | peak | gain over warm start | gain / s.e. | held-out: after SFT → "
                     "after RL (gain) | MI z-score | retrieval accuracy (chance) | minutes |", "|---" * 10 + "|"]
  for r in records:
    (z0, z1), (a0, a1) = (_first_last(r, key) for key in (MI_KEY, RETRIEVAL_KEY))
    ratio = r["gain"] / r["gain_se"] if r["gain_se"] else None
    runs[r["name"]] = {"gain_in_se": ratio, "learned": ratio is not None and ratio > HEALTHY_SE}
    lines.append(f"| {r['name']} | {r['sft_val_success']:.3f} | {r['final_val_success']:.3f} | "
                 f"{r['best_val_success']:.3f} | {r['gain']:+.3f} ± {r['gain_se']:.3f} | {_num(ratio, 1, '+')} | "
                 f"{_heldout_cell(r)} | {_num(z0, 2)} → {_num(z1, 2)} | {_num(a0)} → {_num(a1)} "
                 f"({_num(r['final_retrieval_chance'])}) | {r['minutes']:.0f} |")
  heldout = {json.dumps(r["heldout"]["params"]) for r in records if r.get("heldout")}
  lines += ["", f"Learned: success after RL above the warm start by more than {HEALTHY_SE:g} standard errors of the "
            "paired per-seed change over the fixed validation seeds."]
  if heldout:
    lines += ["", f"Held-out: the same validation seeds played with env params {', '.join(sorted(heldout))} "
              "(`studies.HELDOUT_PARAMS`)."]
  return {"runs": runs}, lines, [("curves.png", "validation success, MI z-score, entropy, kept ratio and retrieval "
                                                "accuracy over iterations")]


def plot_scatter(path: str, records: list[dict], label: str, key: str, result: dict) -> str:
  """Final success against one predictor, a colour per setting."""
  fig, ax = plt.subplots(figsize=(6, 4.5))
  for setting in dict.fromkeys(r["setting"] for r in records):
    points = [(r[key], r["final_val_success"]) for r in records if r["setting"] == setting and r[key] is not None]
    if points:
      ax.scatter(*zip(*points), label=setting, s=30)
  ax.set_title(f"Spearman {_num(result['rho'], 2, '+')} [{_num(result['low'], 2, '+')}, "
               f"{_num(result['high'], 2, '+')}] (n={result['n']})")
  ax.set_xlabel(label)
  ax.set_ylabel("final validation success")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return save_figure(fig, path)


def finished_records(workdir: str, names) -> list[dict]:
  """The run summaries saved so far by the sub-studies `names` under `workdir`."""
  records = []
  for name in names:
    folder = paths.join(workdir, name, "runs")
    if paths.isdir(folder):
      records += [json.loads(paths.read_text(paths.join(folder, f))) for f in paths.listdir(folder)]
  return records


def write_study(workdir: str, name: str, study, records: list[dict], seed: int) -> dict:
  """Writes `workdir/name/`: results.json, report.md and its PNGs; returns the results."""
  study_dir = paths.join(workdir, name)
  env_names = list(dict.fromkeys(r["env"] for r in records))
  if name == "filter":
    summary, body, plots = filter_results(records)
    plot_curves(paths.join(study_dir, "curves.png"), records, env_names)
  elif name == "correlation":
    summary, body, plots = correlation_results(records, study.bootstrap, seed)
    for label, key, _ in PREDICTORS:
      plot_scatter(paths.join(study_dir, f"{key}.png"), records, label, key, summary[key])
  else:
    summary, body, plots = (pretrained_results(records) if name == "pretrained" else
                            collapse_results(records, finished_records(workdir, ("filter", "correlation"))))
    plot_curves(paths.join(study_dir, "curves.png"), records, env_names, STUDY_CURVES)
  results = {"study": name, "summary": summary, "runs": records}
  paths.write_text(paths.join(study_dir, "results.json"), json.dumps(results, indent=2))
  write_report(study_dir, f"Study: {name}", body, [(title, paths.join(study_dir, png)) for png, title in plots])
  return results
