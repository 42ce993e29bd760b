"""`python -m ragen_jax.study`: the grids, a two-iteration study that writes every file, resuming, the summaries."""

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from ragen_jax.config import ConfigError, load_config_file
from ragen_jax.demo.stages import sft_schedule
from ragen_jax.report import comparison
from ragen_jax.study import runner, studies
from ragen_jax.study.report import PREDICTORS, collapse_results, collapse_timing, filter_results
from ragen_jax.study.studies import CORRELATION_SETTINGS, StudyConfig, study_runs
from ragen_jax.trainer import Trainer, read_settings
from tests.demo.test_demo import ROOT, shortened


def test_default_grids_are_the_issues_and_valid():
  config = load_config_file(f"{ROOT}/configs/study.py")
  study = StudyConfig(**config.study.to_dict())
  runs = {name: study_runs(study, name) for name in study.study_names}
  assert {(r.env, r.setting) for r in runs["filter"]} == {(e, s) for e in ("sokoban", "frozenlake")
                                                          for s in ("no_filter", "snr_filter")}
  assert len(runs["filter"]) == 20 and len(runs["correlation"]) >= 16
  varied = {key for r in runs["correlation"] for key in r.overrides}
  assert {"filter.enabled", "filter.value", "algorithm.entropy_coef", "algorithm.kl_coef", "train.actor_lr"} <= varied
  assert any("degrades" in s for s in CORRELATION_SETTINGS)
  assert all(len({r.name for r in rs}) == len(rs) for rs in runs.values())  # a file name per run of a study
  assert {run.setting for run in runs["collapse"]} == set(studies.FLUENT_BONUS_SETTINGS)  # by default the fifth arm
  collapse = study_runs(dataclasses.replace(study, collapse_arms=",".join(studies.COLLAPSE_ARMS)), "collapse")
  assert [run.setting for run in collapse[::study.collapse_seeds * 2]] == [  # every arm, in order
      "no_filter", "templates_no_filter", "reference_no_filter", "fluent_reference_no_filter",
      "fluent_bonus_no_filter"]
  for run in runs["correlation"] + collapse:
    read_settings(runner.run_config(config, run))
  templates = [run for run in collapse if run.warm_start == "templates"]
  assert {run.setting for run in templates} == set(studies.TEMPLATE_SETTINGS)
  assert len(templates) == 2 * study.collapse_seeds
  ws_config = runner.warm_start_config(config, templates[0])  # the demo's SFT, with template demonstrations
  assert ws_config.demo.template_rate == 0.5 and config.demo.template_rate == 0.0
  step = config.demo.copy_steps + config.demo.reading_steps + config.demo.sft_steps - 50  # in the demo's decay
  assert sft_schedule(ws_config, ["sokoban"], "templates")(step) == sft_schedule(config, ["sokoban"])(step)
  ws_config.demo.templates = 5
  with pytest.raises(ConfigError, match=(r"^demo.templates=5: sokoban has 4 sentence templates "
                                         r"\(`demonstrations.TEMPLATE_STYLES`\) for demo.template_rate 0.5$")):
    sft_schedule(ws_config, ["sokoban"], "templates")
  referenced = [run for run in collapse if run.reference]  # the KL loss pulls toward all-template reasoning
  assert {run.setting for run in referenced} == (set(studies.REFERENCE_SETTINGS) | set(studies.FLUENT_SETTINGS)
                                                 | set(studies.FLUENT_BONUS_SETTINGS))
  assert len(referenced) == 6 * study.collapse_seeds
  assert {run.warm_start for run in referenced} == {"few-templates", "few-fluent-templates"}
  assert all(run.overrides["algorithm.use_kl_loss"] for run in referenced)
  assert runner.warm_start_config(config, referenced[0]).demo.template_rate == 0.3
  assert runner.reference_config(config, referenced[0]).demo.template_rate == 1.0
  assert runner.run_config(config, referenced[0], "/ref").model.reference_path == "/ref"
  fluent = [run for run in referenced if run.warm_start == "few-fluent-templates"]  # templates in reading's words
  assert {run.setting for run in fluent} == set(studies.FLUENT_SETTINGS) | set(studies.FLUENT_BONUS_SETTINGS)
  assert len(fluent) == 4 * study.collapse_seeds
  bonus = {run.setting: run for run in fluent if run.setting in studies.FLUENT_BONUS_SETTINGS}
  for name, run in bonus.items():  # the fifth arm: the fourth's runs with a 30x entropy bonus
    fourth = studies.FLUENT_SETTINGS[name.replace("fluent_bonus_", "fluent_reference_")]
    assert run.overrides == fourth | {"algorithm.entropy_coef": 0.03}
    assert runner.run_config(config, run).algorithm.entropy_coef == 0.03 and config.algorithm.entropy_coef == 0.001
  for ws_config in (runner.warm_start_config(config, fluent[0]), runner.reference_config(config, fluent[0])):
    assert ws_config.demo.template_style == "reading"
    sft_schedule(ws_config, ["sokoban"], "few-fluent-templates")
  ws_config.demo.template_style = "free"
  with pytest.raises(ConfigError, match=r"^demo.template_style='free' is not one of 'sentence', 'reading'$"):
    sft_schedule(ws_config, ["sokoban"], "few-fluent-templates")
  for env in ("frozenlake", "bandit"):  # the bundled model, its RL and SFT settings valid on either
    [pretrained] = study_runs(dataclasses.replace(study, pretrained_env=env), "pretrained")
    assert pretrained.env == env and pretrained.overrides["model.path"] == "" and pretrained.warm_start == "pretrained"
    read_settings(runner.run_config(config, pretrained))
    sft_schedule(runner.warm_start_config(config, pretrained), [env], "pretrained")
  assert pretrained.overrides["rollout.max_turns"] == 1 and pretrained.overrides["demo.habit_move"] == ""
  habitual = runner.warm_start_config(config, pretrained)
  habitual.demo.habit_move = "Up"
  with pytest.raises(ConfigError, match="demo.habit_move 'Up' is not a bandit action .its actions are each episode"):
    sft_schedule(habitual, ["bandit"], "pretrained")
  with pytest.raises(ConfigError, match="study.pretrained_env='lightsout'"):
    StudyConfig(pretrained_env="lightsout")
  with pytest.raises(ConfigError, match="study.collapse_env='bandit'"):  # the demo's warm start has no Bandit
    StudyConfig(collapse_env="bandit")
  with pytest.raises(ConfigError, match="study.names='bogus'"):
    StudyConfig(names="filter,bogus")
  with pytest.raises(ConfigError, match="study.only='rho_0.3' is not one of"):
    StudyConfig(only="snr_filter,rho_0.3")
  with pytest.raises(ConfigError, match="study.collapse_arms='fluent_bonus ' is not one of 'lr', 'templates'"):
    StudyConfig(collapse_arms="lr,fluent_bonus ")
  with pytest.raises(ConfigError, match="^study.only='templates_no_filter' is not one of 'fluent_bonus_no_filter', "
                                        "'fluent_bonus_snr_filter'$"):  # a setting of an arm not chosen
    StudyConfig(names="collapse", only="templates_no_filter")
  chosen = StudyConfig(names="collapse", collapse_arms="templates", only="templates_no_filter")
  assert [run.setting for run in study_runs(chosen, "collapse")] == ["templates_no_filter"] * chosen.collapse_seeds


def test_two_iteration_study_writes_every_file_and_resumes(tmp_path, monkeypatch, capsys):
  config = shortened("study", tmp_path)
  config.study.update(names="filter", filter_envs="frozenlake", correlation_env="frozenlake",
                      collapse_env="frozenlake", filter_seeds=1, correlation_seeds=1, collapse_seeds=1,
                      only="snr_filter", bootstrap=50)
  config.train.checkpoint_every = 0
  played = []  # the env params of each validation

  def validation_rollout(trainer, source=None):
    played.append((source or trainer.exp.source).env_params)
    return real_validation(trainer, source)

  real_validation = Trainer.validation_rollout
  monkeypatch.setattr(Trainer, "validation_rollout", validation_rollout)
  monkeypatch.setattr(studies, "HELDOUT_PARAMS", {"frozenlake": {"p_frozen": 0.5}})
  config.lock()  # as the command line's
  runner.run_study(config)  # one real two-iteration run
  # before RL: the validation, then the held-out one; after: the validation of iteration 2, then the held-out one
  assert [params.p_frozen for params in played] == [0.9, 0.5, 0.9, 0.5]
  assert (tmp_path / "warm_start/frozenlake/sft_model/model.safetensors").is_file()
  assert (tmp_path / "filter/rl/frozenlake-snr_filter-s0/metrics.jsonl").is_file()
  record = json.loads((tmp_path / "filter/runs/frozenlake-snr_filter-s0.json").read_text())
  assert 0.0 <= record["final_val_success"] <= 1.0 and record["final_mi_zscore"] is not None
  assert record["curves"]["collapse/trajectory/retrieval_accuracy"] and record["minutes"] > 0
  assert len(record["positions_read"]) == 2 and all(0.0 <= v <= 1.0 for v in record["positions_read"])
  heldout = record["heldout"]
  assert heldout["params"] == {"p_frozen": 0.5} and 0.0 <= heldout["final_val_success"] <= 1.0
  assert heldout["gain"] == pytest.approx(heldout["final_val_success"] - heldout["sft_val_success"])
  changed = config.copy_and_resolve_references()
  changed.demo.sft_steps += 1
  with pytest.raises(ConfigError, match=r"other settings \(1 differ, e.g. demo.sft_steps \d+ now \d+\)"):
    runner.shared_warm_start(changed, "frozenlake")

  # a restart of every sub-study: the warm start and the finished run are not redone, the other runs are
  def fake_run(config, run, sft_dir, study_dir, reference_dir):
    ran.append(f"{study_dir.rsplit('/', 1)[1]}/{run.name}")
    assert sft_dir == str(tmp_path / ("warm_start/frozenlake/sft_model" if run.warm_start == "demo" else "sft"))
    assert reference_dir == (str(tmp_path / "sft") if run.reference else "")
    return record | {"name": run.name, "setting": run.setting, "seed": run.seed,
                     "final_val_success": len(ran) / 20, "final_mi_zscore": len(ran) % 3, "gain": 0.0}

  def fake_warm_start(ws_config, env_names):  # trains a warm start: on the restart, only the templates' are new
    made.append((ws_config.workdir.rsplit("/", 1)[1], ws_config.demo.template_rate))
    return str(tmp_path / "sft"), None, {env_names[0]: 0.5}

  ran, made = [], []
  monkeypatch.setattr(runner, "warm_start", fake_warm_start)
  monkeypatch.setattr(runner, "reinforce_run", fake_run)
  config.study.update(names="filter,correlation,collapse", only="", collapse_arms=",".join(studies.COLLAPSE_ARMS))
  capsys.readouterr()
  results = runner.run_study(config)
  assert ran[0] == "filter/frozenlake-no_filter-s0" and "filter/frozenlake-snr_filter-s0" not in ran
  assert made == [("frozenlake-templates", 0.5), ("frozenlake-few-templates", 0.3),  # the policies' warm starts,
                  ("frozenlake-few-fluent-templates", 0.3), ("frozenlake-few-templates-reference", 1.0),  # then
                  ("frozenlake-few-fluent-templates-reference", 1.0)]  # the KL references
  assert len(ran) == 1 + len(CORRELATION_SETTINGS) + len(studies.COLLAPSE_SETTINGS) + len(studies.TEMPLATE_SETTINGS) \
      + len(studies.REFERENCE_SETTINGS) + len(studies.FLUENT_SETTINGS) + len(studies.FLUENT_BONUS_SETTINGS)
  out = capsys.readouterr().out
  assert f"run {len(ran)}/{len(ran)}: collapse frozenlake-fluent_bonus_snr_filter-s0, about" in out
  assert results["correlation"]["summary"]["final_mi_zscore"]["low"] is not None
  pngs = {"filter": ["curves.png"], "correlation": [f"{key}.png" for _, key, _ in PREDICTORS],
          "collapse": ["curves.png"]}
  for name, files in pngs.items():
    saved = json.loads((tmp_path / name / "results.json").read_text())
    assert len(saved["runs"]) == len(list((tmp_path / name / "runs").iterdir()))
    report = (tmp_path / name / "report.md").read_text()
    for png in files:
      assert f"]({png})" in report, (name, png)
      image = np.asarray(Image.open(tmp_path / name / png).convert("L"), np.float32)
      assert image.shape[0] > 200 and image.std() > 10, (name, png)  # a real picture, not a blank canvas
  assert results["collapse"]["summary"]["false_alarms"]["healthy_runs"] >= 1 + len(CORRELATION_SETTINGS)


def _record(env, setting, seed, final, best, gain, **extra):
  return {"name": f"{env}-{setting}-s{seed}", "env": env, "setting": setting, "seed": seed, "final_val_success": final,
          "best_val_success": best, "gain": gain, "gain_se": 0.01, "kept_ratio": 1.0, "iteration_s": 2.0 + seed,
          "alarm_steps": [], "final_retrieval_chance": 0.1} | extra


def test_filter_results_pair_the_seeds():
  off, on = [0.50, 0.55, 0.52, 0.49], [0.58, 0.56, 0.61, 0.60]
  records = [_record("sokoban", s, i, f, f + 0.02, f - 0.5) for s, finals in (("no_filter", off), ("snr_filter", on))
             for i, f in enumerate(finals)]
  summary, body, _ = filter_results(records + [_record("sokoban", "snr_filter", 9, 0.9, 0.9, 0.4)])  # unpaired
  paired = summary["sokoban"]["paired"]["final_val_success"]
  assert paired["n"] == 4 and paired["t_p"] == pytest.approx(stats.ttest_rel(on, off).pvalue)
  assert paired["wilcoxon_p"] == pytest.approx(stats.wilcoxon(on, off).pvalue)
  assert summary["sokoban"]["no_filter"]["final_val_success"]["se"] == pytest.approx(stats.sem(off))
  assert "| sokoban | 9 | - | +0.400 ± 0.010 |" in body


def test_collapse_timing_and_false_alarms():
  mi = [[2, 1.0], [4, 1.4], [6, 1.1], [8, 0.6], [10, 0.3], [12, 0.5]]
  record = _record("sokoban", "no_filter", 0, 0.3, 0.5, -0.2, alarm_steps=[10, 12], positions_read=[0.9, 0.25], curves={
      "collapse/trajectory/mi_zscore": mi, "collapse/trajectory/retrieval_accuracy": [[2, 0.8], [12, 0.2]],
      "update/policy_entropy": [[1, 1.0], [12, 1.05]]})
  assert collapse_timing(record) == {"first_alarm": 10, "mi_fall_start": 4, "delay": 6}
  healthy = _record("sokoban", "snr_filter", 0, 0.6, 0.6, 0.0, alarm_steps=[6])
  degraded = _record("sokoban", "lr", 0, 0.1, 0.6, -0.3, alarm_steps=[4, 6])
  summary, body, _ = collapse_results([record], [healthy, degraded])
  assert summary["false_alarms"] == {"healthy_runs": 1, "runs_with_alarm": 1, "alarms": 1}
  assert summary["runs"][record["name"]]["entropy_change"] == pytest.approx(0.05)
  assert "| 0.300 | 90% → 25% | 10 | 4 | 6 | 1.00 → 0.50 | 0.800 → 0.200 (0.100) | +5% |" in body[2]
  _, body, _ = collapse_results([record | {"positions_read": None}], [])  # a record from before the column
  assert "| 0.300 | - | 10 |" in body[2]


@pytest.mark.parametrize("env", ["frozenlake", "bandit"])
def test_pretrained_substudy_fine_tunes_the_checkpoint_in_its_own_template(tmp_path, monkeypatch, env):
  import transformers
  from safetensors.numpy import load_file

  from ragen_jax.demo import stages
  from ragen_jax.models.gguf_convert import bundled_tokenizer_dir
  from ragen_jax.models.scratch import save_scratch_model

  tokenizer = transformers.AutoTokenizer.from_pretrained(bundled_tokenizer_dir())  # SmolLM2's, chat template too
  save_scratch_model(tokenizer, tmp_path / "checkpoint", hidden_size=32, num_layers=1)
  config = shortened("study", tmp_path / "study")
  config.rollout.max_turns = 1
  config.study.update(names="pretrained", pretrained_env=env, pretrained_model=str(tmp_path / "checkpoint"))
  monkeypatch.setattr(studies, "PRETRAINED", {"demo.sft_episodes": 4, "demo.sft_steps": 3, "demo.sft_batch_size": 2,
                                              "rollout.max_new_tokens": 48, "filter.enabled": True})
  demonstrated, ran = [], []

  def demonstrations(config, name, tokenizer):
    examples, success = real_demonstrations(config, name, tokenizer)
    demonstrated.extend(tokenizer.decode(ids) for ids, _ in examples)
    return examples, success

  def fake_run(config, run, sft_dir, study_dir, reference_dir):  # the RL itself is every sub-study's (the test above)
    ran.append((run, sft_dir))
    assert reference_dir == ""  # the KL reference is the policy's start
    heldout = studies.HELDOUT_PARAMS.get(run.env)  # the real RL's record (the two-iteration test above)
    return _record(run.env, run.setting, run.seed, 0.3, 0.35, 0.1, name=run.name, sft_val_success=0.2, minutes=1.0,
                   curves={"collapse/trajectory/mi_zscore": [[1, 1.0], [2, 0.5]],
                           "collapse/trajectory/retrieval_accuracy": [[1, 0.9], [2, 0.8]]},
                   heldout=heldout and {"params": heldout, "sft_val_success": 0.25, "final_val_success": 0.5,
                                        "gain": 0.25, "gain_se": 0.05})

  drawn, real_save = {}, comparison._save

  def save(fig, path):
    drawn[path.rsplit("/", 1)[-1]] = sum(len(ax.lines) for ax in fig.axes)
    return real_save(fig, path)

  real_demonstrations = stages.demonstrations
  monkeypatch.setattr(comparison, "_save", save)
  monkeypatch.setattr(stages, "demonstrations", demonstrations)
  monkeypatch.setattr(runner, "reinforce_run", fake_run)
  results = runner.run_study(config)
  warm = tmp_path / f"study/warm_start/{env}-pretrained"
  # the checkpoint's own template; Bandit's replies name the two arms
  assert all(f"<|im_start|>assistant\n<think>{'arms ' if env == 'bandit' else 'player ('}" in text
             for text in demonstrated)
  saved = json.loads((warm / "warm_start.json").read_text())
  assert saved["settings"]["model.path"] == str(tmp_path / "checkpoint") and saved["settings"]["demo.sft_steps"] == 3
  tuned = transformers.AutoTokenizer.from_pretrained(warm / "sft_model")
  assert tuned.get_vocab() == tokenizer.get_vocab() and tuned.chat_template == tokenizer.chat_template
  before, after = load_file(tmp_path / "checkpoint/model.safetensors"), load_file(warm / "sft_model/model.safetensors")
  assert before.keys() == after.keys() and any(not np.array_equal(before[k], after[k]) for k in before)
  [(run, sft_dir)] = ran
  assert run.overrides["model.path"] == str(tmp_path / "checkpoint") and sft_dir == str(warm / "sft_model")
  assert results["pretrained"]["summary"]["runs"][run.name] == {"gain_in_se": 10.0, "learned": True}
  report = (tmp_path / "study/pretrained/report.md").read_text()
  heldout = "0.250 → 0.500 (+0.250 ± 0.050)" if env == "bandit" else "-"  # Bandit's unseen arm names
  assert (f"| {run.name} | 0.200 | 0.300 | 0.350 | +0.100 ± 0.010 | +10.0 | {heldout} | 1.00 → 0.50 | "
          "0.900 → 0.800 (0.100) | 1 |") in report
  assert ('env params {"name_pool": "test"}' in report) == (env == "bandit")
  assert drawn["curves.png"] == 4  # the two curves the run has, each a seed line and a mean, in its own colour
