"""The study's work: one warm start per environment, then the runs of each selected sub-study, then its report.

Layout under `workdir`: `warm_start/<env>/` (tokenizer, SFT model, `warm_start.json` once complete; other
kinds, `Run.warm_start`, in `warm_start/<env>-<kind>/`, and a KL reference, `Run.reference`, in
`warm_start/<env>-<kind>-reference/`),
`<study>/rl/<run>/` (each run's RL directory), `<study>/runs/<run>.json` (its summary, written when it
finishes: a restarted study skips the runs that have one, and starts an unfinished run again) and the
sub-study's report files (`study.report`).
"""

from __future__ import annotations

import copy
import json
import time

import numpy as np

from ragen_jax import paths
from ragen_jax.config import ConfigError
from ragen_jax.demo.stages import log, pretrained_warm_start, reinforce, sft_schedule, warm_start
from ragen_jax.report.comparison import run_summary
from ragen_jax.report.writer import read_metrics
from ragen_jax.study import studies
from ragen_jax.study.report import STUDY_CURVES, write_study
from ragen_jax.study.studies import Run, StudyConfig, study_runs
from ragen_jax.trainer import read_settings

WARM_START_FILE = "warm_start.json"
LAST_VALUES = {"final_mi_zscore": "collapse/trajectory/mi_zscore",
               "final_retrieval_accuracy": "collapse/trajectory/retrieval_accuracy",
               "final_retrieval_chance": "collapse/trajectory/retrieval_chance_level",
               "final_policy_entropy": "update/policy_entropy"}


def run_config(config, run: Run, reference_dir: str = ""):
  """`config` with the run's environment, RL seed and overrides (and `reference_dir`, its KL reference model)."""
  rl_config = copy.deepcopy(config)
  rl_config.seed = config.seed + run.seed
  rl_config.env.name = run.env
  rl_config.update_from_flattened_dict(run.overrides)
  rl_config.model.reference_path = reference_dir
  return rl_config


def warm_start_settings(config) -> dict:
  """What a warm start depends on, flat: the seed, the model path (of a pretrained warm start), the `demo` section
  (SFT) and the `rollout` section (layout)."""
  sections = {f"{section}.{key}": value for section in ("demo", "rollout")
              for key, value in config[section].to_dict().items()}
  return json.loads(json.dumps({"seed": config.seed, "model.path": config.model.path} | sections))


def warm_start_config(config, run: Run):
  """The config of `run`'s warm start: for the demo's, the study's config; for another kind, the study's config
  with the run's overrides (the same for every seed and setting of that kind)."""
  ws_config = copy.deepcopy(config)
  if run.warm_start != "demo":
    ws_config.update_from_flattened_dict(run.overrides)
  return ws_config


def reference_config(config, run: Run):
  """The config of the warm start that is `run`'s KL reference (`Run.reference`)."""
  ref_config = warm_start_config(config, run)
  ref_config.update_from_flattened_dict(run.reference)
  return ref_config


def shared_warm_start(config, env: str, kind: str = "demo") -> str:
  """The SFT model dir of `env`'s warm start of `kind` (`Run.warm_start`): trained once, reused by every run and
  every restart made with the same `warm_start_settings` (others are a ConfigError naming a difference)."""
  workdir = paths.join(config.workdir, "warm_start", env if kind == "demo" else f"{env}-{kind}")
  done = paths.join(workdir, WARM_START_FILE)
  settings = warm_start_settings(config)
  if paths.exists(done):
    saved = json.loads(paths.read_text(done)).get("settings", {})
    changed = sorted(key for key in settings.keys() | saved.keys() if settings.get(key) != saved.get(key))
    if changed:
      key = changed[0]
      raise ConfigError(f"the warm start in {workdir} was made with other settings ({len(changed)} differ, e.g. "
                        f"{key} {saved.get(key)!r} now {settings.get(key)!r}); use another workdir or remove it")
    log(f"{env}: reusing the warm start in {workdir}")
    return paths.join(workdir, "sft_model")
  ws_config = copy.deepcopy(config)
  ws_config.workdir = workdir
  clock = time.time()
  sft_dir, _, demo_success = (pretrained_warm_start if kind == "pretrained" else warm_start)(ws_config, [env])
  paths.write_text(done, json.dumps({"demo_success": demo_success[env], "minutes": (time.time() - clock) / 60,
                                     "settings": settings}))
  return sft_dir


def _last(rows: list[dict], key: str) -> float | None:
  values = [r[key] for r in rows if r.get(key) is not None]
  return values[-1] if values else None


def reinforce_run(config, run: Run, sft_dir: str, study_dir: str, reference_dir: str = "") -> dict:
  """RL of `run` from `sft_dir` (with `reference_dir`'s model as the KL reference); returns its summary."""
  clock = time.time()
  heldout = studies.HELDOUT_PARAMS.get(run.env)
  trainer, start, final = reinforce(run_config(config, run, reference_dir), run.env, sft_dir,
                                    paths.join(study_dir, "rl", run.name), heldout)
  rows = read_metrics(trainer.workdir)
  return ({"name": run.name, "env": run.env, "setting": run.setting, "seed": run.seed, "overrides": run.overrides,
           "reference": run.reference,
           "iterations": trainer.iteration, "early_stop": bool(final.get("early_stop", 0.0)),
           "sft_val_success": start["val/success"], "final_val_success": final["val/success"],
           "positions_read": [start["val/positions_read"], final["val/positions_read"]],
           "best_val_success": trainer.best_val_success, "gain": final["val/gain"], "gain_se": final["val/gain_se"],
           "alarm_steps": [r["step"] for r in rows if r.get("collapse/alarm")],
           "heldout": None if heldout is None else {"params": heldout, "sft_val_success": start["heldout/success"],
                                                   "final_val_success": final["heldout/success"],
                                                   "gain": final["heldout/gain"], "gain_se": final["heldout/gain_se"]}}
          | {name: _last(rows, key) for name, key in LAST_VALUES.items()}
          | run_summary(rows, start["val/success"], STUDY_CURVES) | {"minutes": (time.time() - clock) / 60})


def record_path(study_dir: str, run: Run) -> str:
  return paths.join(study_dir, "runs", f"{run.name}.json")


def run_study(config) -> dict:
  """Every selected sub-study (settings of all runs checked first); returns each one's results."""
  study = StudyConfig(**config.study.to_dict())
  plans = {name: study_runs(study, name) for name in study.study_names}
  for runs in plans.values():
    for run in runs:
      read_settings(run_config(config, run))
      sft_schedule(warm_start_config(config, run), [run.env], run.warm_start)
      if run.reference:
        sft_schedule(reference_config(config, run), [run.env], run.warm_start)
  dirs = {name: paths.join(config.workdir, name) for name in plans}
  todo = [(name, run) for name, runs in plans.items() for run in runs if not paths.exists(record_path(dirs[name], run))]
  log(f"studies {', '.join(plans)}: {sum(map(len, plans.values()))} runs, {len(todo)} still to run")
  firsts = {(run.env, run.warm_start): run for _, run in todo}  # one warm start per environment and kind
  warm = {key: shared_warm_start(warm_start_config(config, run), *key) for key, run in firsts.items()}
  references = {key: shared_warm_start(reference_config(config, run), key[0], f"{key[1]}-reference")
                for key, run in firsts.items() if run.reference}  # the KL reference of a kind's runs
  # the time left: the mean time of the runs finished so far, this time or before, per run still to run
  minutes = [json.loads(paths.read_text(record_path(dirs[name], run)))["minutes"] for name, runs in plans.items()
             for run in runs if (name, run) not in todo]
  done, results = 0, {}
  for name, runs in plans.items():
    for run in runs:
      if (name, run) not in todo:
        continue
      eta = f", about {np.mean(minutes) * (len(todo) - done):.0f} min left" if minutes else ""
      log(f"run {done + 1}/{len(todo)}: {name} {run.name}{eta}")
      record = reinforce_run(config, run, warm[run.env, run.warm_start], dirs[name],
                             references.get((run.env, run.warm_start), ""))
      paths.write_text(record_path(dirs[name], run), json.dumps(record, indent=2))
      minutes.append(record["minutes"])
      done += 1
    records = [json.loads(paths.read_text(record_path(dirs[name], run))) for run in runs]
    results[name] = write_study(config.workdir, name, study, records, seed=config.seed)
    log(f"{name}: report in {paths.join(dirs[name], 'report.md')}")
  return results
