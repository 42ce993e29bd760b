"""The training loop: iterations with finite losses, a run stopped by SIGTERM that resumes exactly, checkpoints that
never go backwards, the non-finite update guard, sharded update = 1 device."""

import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from PIL import Image
from safetensors.numpy import load_file

from ragen_jax import preemption
from ragen_jax.assembly import load_reference
from ragen_jax.checkpoint import Checkpointer, RestoreError, abstract_like
from ragen_jax.config import ConfigError, load_config_file
from ragen_jax.finite import first_nonfinite
from ragen_jax.models import Model, forward_logits, init_params, load_pretrained
from ragen_jax.models.scratch import scratch_config
from ragen_jax.models.tokenizer import train_tokenizer
from ragen_jax.report.startup import startup_lines
from ragen_jax.report.summary import training_report
from ragen_jax.report.writer import read_metrics
from ragen_jax.rl import update as update_lib
from ragen_jax.train import main as train_main
from ragen_jax.trainer import Trainer, TrainingHalted, train
from tests.report.test_writer import tensorboard_events

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(model_dir, workdir, **overrides):
  config = load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.model.path = str(model_dir)
  config.workdir = str(workdir)
  for key, value in overrides.items():
    section, name = key.split(".")
    config[section][name] = value
  return config


def tensorboard_texts(run_dir) -> dict[str, list[int]]:
  """Tag -> steps of the text summaries in a run's TensorBoard event files."""
  texts = {}
  for event in tensorboard_events(run_dir / "tensorboard"):
    for value in event.summary.value:
      if value.metadata.plugin_data.plugin_name == "text":
        texts.setdefault(value.tag.removesuffix("/text_summary"), []).append(event.step)  # tensorboardX adds it
  return texts


def test_training_iterations_log_checkpoint_and_export(replying_model_dir, tmp_path, caplog):
  caplog.set_level(logging.INFO)
  # the learner and scorer rematerialise each layer and score the LM head in blocks, as the paper configs do
  final = train(_config(replying_model_dir, tmp_path, **{"train.iterations": 3, "algorithm.preset": "grpo",
                                                         "diagnostics.compute_freq": 2, "model.remat": "full",
                                                         "model.logits_chunk": 16, "algorithm.use_kl_loss": True,
                                                         "model.ref_dtype": "bfloat16", "train.profile_steps": (2,)}))
  rows = read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(math.isfinite(r["update/kl_loss"]) for r in rows)  # against the bfloat16 reference
  # the MI diagnostics ran at steps 1 and 3; step 2 logs no placeholder for them
  assert ["collapse/trajectory/mi_zscore" in r for r in rows] == [True, False, True]
  assert [r["collapse/computed"] for r in rows] == [1.0, 0.0, 1.0]
  for row in rows:
    assert all(math.isfinite(v) for v in row.values())
    assert 0.0 <= row["train/success"] <= 1.0
    phases = [row[f"time/{phase}_s"] for phase in ("rollout", "scoring", "diagnostics", "update")]
    assert all(t > 0 for t in phases) and row["time/iteration_s"] == pytest.approx(sum(phases))
  assert any(row["update/num_updates"] > 0 for row in rows), "the filter never let an update through"
  assert "val/success" in rows[1] and "val/success" not in rows[0]
  assert sorted(os.listdir(tmp_path / "checkpoints"), key=int)[-1] == "3"
  assert os.listdir(tmp_path / "tensorboard")
  assert json.loads((tmp_path / "config.json").read_text())["train"]["profile_steps"] == [2]
  traces = list((tmp_path / "profile" / "plugins" / "profile").glob("*/*.xplane.pb"))  # one per trace
  assert len(traces) == 1 and traces[0].stat().st_size > 0
  assert (tmp_path / "final_model" / "model.safetensors").is_file()
  assert json.loads((tmp_path / "final_metrics.json").read_text())["train/success"] == final["train/success"]
  # What a newcomer is told at the start, and what the run leaves besides metrics
  count = sum(x.size for x in jax.tree.leaves(load_file(str(replying_model_dir / "model.safetensors"))))
  said = caplog.text
  for line in (f"model: {replying_model_dir}\n", f"; {count:,} parameters", "devices: 8 cpu in 1 process(es); mesh "
               "data=8 x fsdp=1 x tensor=1 over 8 of them", "run: 3 iterations of 2 groups x 4 sokoban episodes",
               "remat full, LM head in blocks of 16 tokens",
               "compiling: iteration 1"):
    assert line in said, line
  assert f"Total: {count:,}" in (tmp_path / "parameters.txt").read_text()
  report = (tmp_path / "report.md").read_text()
  assert "| val/success | 2 |" in report and "![" in report and "`transcripts.jsonl`" in report
  image = np.asarray(Image.open(tmp_path / "report.png").convert("L"), np.float32)
  assert image.shape[0] > 300 and image.std() > 10
  transcripts = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
  assert [(r["step"], r["seed"]) for r in transcripts] == [(step, 123 + i) for step in (2, 3) for i in range(4)]
  assert tensorboard_texts(tmp_path) == {f"transcripts/{i}": [2, 3] for i in range(4)}


# Checkpoints only when forced: the preempted run's, and none at the end.
PREEMPTED_RUN = {"train.iterations": 2, "train.val_every": 0, "train.checkpoint_every": 0}


def test_a_run_stopped_by_sigterm_and_run_again_equals_the_uninterrupted_run(replying_model_dir, tmp_path, caplog):
  caplog.set_level(logging.INFO)
  train(_config(replying_model_dir, tmp_path / "a", **PREEMPTED_RUN))
  phases = (update_lib.score, update_lib.diagnose, update_lib.learn)
  compiled = [phase._cache_size() for phase in phases]
  workdir = tmp_path / "b"
  workdir.mkdir()
  env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir,  # what run "a" compiled
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  with open(workdir / "worker.log", "w") as log:
    worker = subprocess.Popen([sys.executable, "-m", "tests.test_train", str(replying_model_dir), str(workdir)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
  try:
    for line in worker.stdout:
      if line == "iteration 1 waits for SIGTERM\n":
        worker.send_signal(signal.SIGTERM)
    code = worker.wait(timeout=300)
  finally:
    worker.kill()
  output = (workdir / "worker.log").read_text()
  assert code == preemption.PREEMPTED_EXIT_CODE, output[-3000:]
  assert ("preempted (SIGTERM) after iteration 1; the newest checkpoint is of iteration 1; exiting with code 75"
          in output)
  assert os.listdir(workdir / "checkpoints") == ["1"] and not (workdir / "final_model").exists()
  train(_config(replying_model_dir, workdir, **PREEMPTED_RUN))  # resumes by itself
  assert f"resuming from the checkpoint of iteration 1 in {workdir / 'checkpoints'}" in caplog.text
  assert [phase._cache_size() for phase in phases] == compiled  # one trace and compile per process
  for a, b in zip(read_metrics(str(tmp_path / "a")), read_metrics(str(workdir)), strict=True):
    assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
        k: v for k, v in b.items() if not k.startswith("time/")}
  assert _metric_steps(workdir) == [1, 2]
  straight, resumed = (load_file(str(tmp_path / run / "final_model" / "model.safetensors")) for run in "ab")
  assert straight.keys() == resumed.keys()
  for name, value in straight.items():
    np.testing.assert_array_equal(resumed[name], value, err_msg=name)


def _corrupt(step_dir):
  for root, _, files in os.walk(step_dir):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")


def _metric_steps(workdir) -> list[int]:
  """The step of every row of metrics.jsonl, read as strict JSON (NaN or Infinity fail)."""
  def refuse(constant):
    raise AssertionError(f"metrics.jsonl holds {constant}: not JSON")
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return [json.loads(line, parse_constant=refuse)["step"] for line in lines if line.strip()]


def test_broken_checkpoints_are_set_aside_and_every_later_save_happens(replying_model_dir, tmp_path):
  config = _config(replying_model_dir, tmp_path)  # a checkpoint every iteration, validation every other one
  trainer = Trainer.create(config)
  assert trainer.last_validation is None
  final = trainer.run(2)
  trainer.checkpointer.close()
  assert final["val/success"] == pytest.approx(np.mean(np.asarray(trainer.last_validation.success, np.float64)))
  # the transcripts are the validation episodes, turn by turn, with the actions the environment stepped
  val = jax.device_get(trainer.last_validation)
  transcripts = [json.loads(line) for line in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
  assert len(transcripts) == 4
  for i, record in enumerate(transcripts):
    text = record["system"] + "".join(turn["prompt"] + turn["reply"] for turn in record["turns"])
    assert text == trainer.exp.tokenizer.decode(val.tokens[i][val.valid[i]].tolist())
    assert [t["reward"] for t in record["turns"]] == pytest.approx(val.turn_rewards[i, :val.num_turns[i]].tolist())
    assert [t["format_ok"] for t in record["turns"]] == val.format_ok[i, :val.num_turns[i]].tolist()
    # stepped: every recognised action (2 a turn at most, 4 in all within the budget of 10) unless one ends it
    assert sum(len(t["actions"]) for t in record["turns"]) == val.num_actions[i]
  assert any(t["actions"] == ["Up", "Left"] for r in transcripts for t in r["turns"])  # the model's usual REPLY
  np.testing.assert_array_equal(np.asarray(trainer.validation_rollout().tokens),  # fixed seeds and key
                                np.asarray(trainer.last_validation.tokens))
  checkpoints = tmp_path / "checkpoints"
  # resume to the same iteration: 1 restores, the broken 2 is moved aside, and 2 is saved anew
  _corrupt(checkpoints / "2")
  resumed = Trainer.create(config)
  assert resumed.try_resume() and resumed.iteration == 1
  assert [p.name.split(".")[0] for p in checkpoints.glob("*.broken-*")] == ["2"]
  resumed.run(2)
  resumed.checkpointer.close()
  assert resumed.checkpointer.steps() == [1, 2]
  # the new 2 breaks too; resume to a later iteration: 2 and 3 are both saved, and 3 restores
  _corrupt(checkpoints / "2")
  later = Trainer.create(config)
  assert later.try_resume() and later.iteration == 1
  later.run(3)
  later.checkpointer.close()
  assert later.checkpointer.steps() == [1, 2, 3] and len(list(checkpoints.glob("2.broken-*"))) == 2
  again = Trainer.create(config)
  assert again.try_resume() and again.iteration == 3
  assert _metric_steps(tmp_path) == [1, 2, 3]  # iteration 2 ran three times and is logged once
  transcripts = (tmp_path / "transcripts.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in transcripts] == [2] * 4 + [3] * 4  # and its transcripts once
  # none restores: an error, not a fresh start, and nothing is moved
  for step in (1, 2, 3):
    _corrupt(checkpoints / str(step))
  with pytest.raises(RestoreError, match="none of the 3 checkpoints"):
    Trainer.create(config).try_resume()
  assert sorted(p.name for p in checkpoints.iterdir() if ".broken-" not in p.name) == ["1", "2", "3"]
  # a fresh run in a workdir that holds checkpoints would skip every save up to them: it does not start
  with pytest.raises(ConfigError, match=r"resume from them first \(Trainer.try_resume"):
    Trainer.create(config).run(1)
  config.train.resume = False  # refused before the model loads, unless the earlier run is deleted
  with pytest.raises(ConfigError, match=f"workdir='{tmp_path}' holds an earlier run \\(checkpoints, config.json, "):
    Trainer.create(config)
  (tmp_path / "jax_cache").mkdir()
  config.train.overwrite = True
  fresh = Trainer.create(config)
  fresh.checkpointer.close()
  assert not fresh.checkpointer.steps()
  assert sorted(os.listdir(tmp_path)) == ["checkpoints", "jax_cache"]  # an empty one, and the compilation cache


class NaNScores:
  """A rollout source whose episode scores are NaN from the trainer's second iteration on (a broken reward)."""

  def __init__(self, trainer):
    self.trainer, self.source, self.seq_len = trainer, trainer.exp.source, trainer.exp.source.seq_len

  def run(self, params, seeds_B, group_ids_B, key, split="train"):
    traj = self.source.run(params, seeds_B, group_ids_B, key, split)
    return traj.replace(score=traj.score * np.nan) if self.trainer.iteration >= 1 else traj


def test_non_finite_updates_are_rejected_never_saved_and_halt_the_run(replying_model_dir, tmp_path):
  config = _config(replying_model_dir, tmp_path, **{"algorithm.preset": "grpo", "filter.enabled": False,
                                                    "train.iterations": 6, "train.max_rejected_updates": 3,
                                                    "train.val_every": 0})
  trainer = Trainer.create(config)
  trainer.exp.source = NaNScores(trainer)
  with pytest.raises(TrainingHalted, match="4 optimizer steps in a row had a non-finite loss"):
    trainer.run()  # two optimizer steps an iteration: iteration 3 makes the streak 4
  trainer.checkpointer.close()
  rows = read_metrics(str(tmp_path))
  assert _metric_steps(tmp_path) == [1, 2, 3]  # strict JSON
  assert [r["update/rejected_updates"] for r in rows] == [0, 2, 2]
  assert [r["update/num_updates"] for r in rows] == [2, 0, 0]
  assert [r["update/rejected_streak"] for r in rows] == [0, 2, 4]
  assert [r["update/pg_loss"] is None for r in rows] == [False, True, True]  # logged as null, not dropped
  training_report(str(tmp_path), "a halted run", [])  # plots and table leave the nulls (scores of 2, 3) out
  assert "| train/score | 1 |" in (tmp_path / "report.md").read_text() and (tmp_path / "report.png").is_file()
  # iteration 3 halted before its save; checkpoint 2 is finite and holds the weights the halted run ended with
  assert trainer.checkpointer.steps() == [1, 2]
  step, restored, _ = Checkpointer(str(tmp_path / "checkpoints"), 1, 3).restore_latest(abstract_like(trainer.state))
  assert step == 2 and first_nonfinite(restored) is None
  for x, y in zip(jax.tree.leaves(restored.policy), jax.tree.leaves(trainer.state.policy)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# The collapse diagnostics run sharded in one of them (their numbers: tests/diagnostics/test_cross_scoring.py); the
# LoRA case trains adapters of policy and critic against the base as KL reference.
@pytest.mark.parametrize("preset,diagnostics,lora_rank", [("ppo", True, 0), ("grpo", False, 0), ("ppo", False, 4)])
def test_sharded_update_equals_single_device(replying_model_dir, tmp_path, preset, diagnostics, lora_rank):
  results = []
  for shape in ((1, 1, 1), (2, 2, 2)):
    config = _config(replying_model_dir, tmp_path / str(shape), **{"algorithm.preset": preset,
                                                                   "filter.enabled": False,
                                                                   "diagnostics.enabled": diagnostics,
                                                                   "algorithm.use_kl_loss": bool(lora_rank)})
    config.model.lora.rank = lora_rank
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = shape
    config.mesh.num_devices = int(np.prod(shape))
    trainer = Trainer.create(config)
    assert trainer.exp.mesh.size == np.prod(shape)
    shardings = jax.tree.map(lambda x: x.sharding, trainer.state)
    metrics = trainer.train_iteration()
    # the jitted phases give the state back in the layout it came in (what donation and the next step need)
    assert all(jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), trainer.state,
                                            shardings)))
    results.append((metrics, jax.device_get(trainer.state.policy)))
  (m1, p1), (m8, p8) = results
  assert m1["train/score"] == m8["train/score"]
  for key in ("update/pg_loss", "update/grad_norm", "update/policy_entropy") + ("update/kl_loss",) * bool(lora_rank):
    np.testing.assert_allclose(m1[key], m8[key], rtol=2e-4, atol=1e-6, err_msg=key)
  # Adam's first step is about lr * sign(grad): float noise in a near-zero gradient moves a weight by up
  # to 2 * lr (1e-3 here), so the bound is a tenth of one step.
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8)):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_training_with_a_limited_context_window(replying_model_dir, tmp_path):
  config = _config(replying_model_dir, tmp_path, **{"rollout.context_window_mode": "single_turn"})
  trainer = Trainer.create(config)
  traj = trainer.exp.source.run(trainer.state.policy, np.arange(8), np.repeat(np.arange(2), 4), jax.random.PRNGKey(0))
  later_turns = np.asarray(traj.valid) & (np.asarray(traj.turn_of_token) > 0)
  assert later_turns.any() and (np.asarray(traj.visible_from)[later_turns] > 1).all()
  metrics = trainer.train_iteration()
  assert all(math.isfinite(v) for v in metrics.values())


def test_optimizer_states_and_a_bfloat16_reference_follow_the_parameters_shardings(replying_model_dir, tmp_path):
  config = _config(replying_model_dir, tmp_path, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2,
                                                    "algorithm.use_kl_loss": True, "model.ref_dtype": "bfloat16"})
  trainer = Trainer.create(config)  # PPO: policy and critic, each with its Adam moments
  trainer.checkpointer.close()
  policy, critic = trainer.state.policy, trainer.state.critic
  assert policy["layers"]["gate_proj"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  adams = [(s, params) for opt, params in ((trainer.state.policy_opt, policy), (trainer.state.critic_opt, critic))
           for s in jax.tree.leaves(opt, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
           if isinstance(s, optax.ScaleByAdamState)]
  assert len(adams) == 2
  for adam, params in adams:
    for moment in (adam.mu, adam.nu):
      for (path, m), p in zip(jax.tree_util.tree_flatten_with_path(moment)[0], jax.tree.leaves(params)):
        assert m.sharding.is_equivalent_to(p.sharding, m.ndim), jax.tree_util.keystr(path)  # never replicated
  for (path, ref), p in zip(jax.tree_util.tree_flatten_with_path(trainer.ref_params)[0],
                            jax.tree.leaves(trainer.exp.model.params)):
    assert ref.dtype == jnp.bfloat16 and ref.sharding.is_equivalent_to(p.sharding, ref.ndim), jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(p.astype(jnp.bfloat16)))


def test_a_reference_checkpoint_is_what_the_kl_loss_scores_against(replying_model, replying_model_dir, tokenizer,
                                                                   tmp_path):
  reference = dataclasses.replace(replying_model, params=init_params(replying_model.config, jax.random.key(1)))
  reference_dir = reference.export(tmp_path / "reference", tokenizer)
  config = _config(replying_model_dir, tmp_path / "run", **{
      "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2, "algorithm.preset": "grpo", "algorithm.use_kl_loss": True,
      "model.reference_path": str(reference_dir), "model.ref_dtype": "bfloat16", "train.val_every": 0,
      "filter.enabled": False})
  trainer = Trainer.create(config)
  for (path, ref), p, expected in zip(jax.tree_util.tree_flatten_with_path(trainer.ref_params)[0],
                                      jax.tree.leaves(trainer.exp.model.params), jax.tree.leaves(reference.params)):
    assert ref.sharding.is_equivalent_to(p.sharding, ref.ndim), jax.tree_util.keystr(path)  # the policy's shardings
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(expected.astype(jnp.bfloat16)))
  # loaded in bfloat16, not loaded in the policy's float32 and cast afterwards (a transient full copy at scale)
  loaded = load_reference(trainer.settings.model, trainer.exp.model, trainer.exp.tokenizer)
  assert {x.dtype for x in jax.tree.leaves(loaded)} == {jnp.dtype(jnp.bfloat16)}
  # the policy starts as the replying model, far from a random one (against its own start the KL would be ~0)
  assert trainer.train_iteration()["update/kl_loss"] > 1.0
  trainer.checkpointer.close()


def test_a_reference_needs_the_kl_loss_and_the_policy_s_shapes_and_tokenizer(replying_model, replying_model_dir,
                                                                             tokenizer, tmp_path):
  kl = {"algorithm.use_kl_loss": True}
  with pytest.raises(ConfigError, match=r"^model.reference_path=.*: only the KL loss scores a reference"):
    Trainer.create(_config(replying_model_dir, tmp_path / "a", **{"model.reference_path": str(replying_model_dir)}))
  with pytest.raises(ConfigError, match=r"^model.reference_path='.*missing': "):
    Trainer.create(_config(replying_model_dir, tmp_path / "b", **kl,
                           **{"model.reference_path": str(tmp_path / "missing")}))
  other_tokenizer = train_tokenizer(["Turn 1: a different corpus, so other tokens."] * 20, vocab_size=300)
  other_words = replying_model.export(tmp_path / "other_tokenizer", other_tokenizer)
  narrower = scratch_config(tokenizer, hidden_size=32)
  other_shapes = Model(config=narrower, params=init_params(narrower, jax.random.key(0)),
                       mesh=replying_model.mesh).export(tmp_path / "other_shapes", tokenizer)
  for i, (directory, what) in enumerate(((other_words, "its tokenizer is not model.path's"),
                                         (other_shapes, "its parameter shapes are not model.path's"))):
    config = _config(replying_model_dir, tmp_path / f"c{i}", **kl, **{"model.reference_path": str(directory)})
    with pytest.raises(ConfigError, match=f"^model.reference_path='{directory}': {what}"):
      Trainer.create(config)


def test_lora_trains_and_saves_the_adapters_only_over_a_shared_frozen_base(replying_model_dir, tmp_path):
  config = _config(replying_model_dir, tmp_path, **{"filter.enabled": False, "algorithm.use_kl_loss": True,
                                                    "train.val_every": 0})  # PPO: a critic too
  config.model.lora.rank, config.model.lora.alpha = 4, 8.0
  config.diagnostics.grad_analysis = True
  trainer = Trainer.create(config)
  model_config = trainer.exp.model.config
  trained = sum(x.size for x in jax.tree.leaves(trainer.state.policy))
  assert f"  LoRA rank 4 (alpha 8) on q, k, v, o, gate, up, down: {trained:,} trained parameters" in "\n".join(
      startup_lines(trainer.exp))
  base_before = jax.device_get(trainer.base)
  # the KL reference is the base itself (same arrays, adapters off), not a copy
  assert all(r is b for r, b in zip(jax.tree.leaves(trainer.ref_params), jax.tree.leaves(trainer.base)))
  paths = lambda tree: [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]  # noqa: E731
  assert paths(trainer.state.policy) and all("_lora']" in p for p in paths(trainer.state.policy))
  assert {p.split("]")[0] for p in paths(trainer.state.critic)} == {"['layers'", "['value_head'"}
  adam = [s for s in jax.tree.leaves(trainer.state.policy_opt, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
          if isinstance(s, optax.ScaleByAdamState)][0]
  assert paths(adam.mu) == paths(trainer.state.policy)  # moments of the adapters, none of the base
  rows = [trainer.train_iteration() for _ in range(2)]
  trainer.iteration = 2
  assert all(row["update/num_updates"] > 0 for row in rows)
  # the first mini-batch scores fresh adapters (b = 0): exactly the reference; later ones drift from it
  assert 0.0 < rows[0]["update/kl_loss"] < rows[1]["update/kl_loss"]
  assert rows[0]["grad_analysis/bucket_0/task_grad_norm"] > 0.0
  for before, after in zip(jax.tree.leaves(base_before), jax.tree.leaves(trainer.base)):
    np.testing.assert_array_equal(before, np.asarray(after))  # frozen
  assert all(np.any(np.asarray(v["b"])) for v in trainer.state.policy["layers"].values())  # trained from zero

  trainer.checkpointer.maybe_save(2, trainer.state, trainer.host_state(), force=True)
  _, restored, _ = trainer.checkpointer.restore_latest(abstract_like(trainer.state))
  assert paths(restored.policy) == paths(trainer.state.policy)
  trainer.checkpointer.close()
  trainer.export_policy(str(tmp_path / "final_model"))
  tokens = np.asarray(trainer.exp.source.run(trainer.rollout_params(), np.arange(8), np.repeat(np.arange(2), 4),
                                             jax.random.PRNGKey(0)).tokens)
  adapted = np.asarray(forward_logits(model_config, trainer.policy_params(), tokens))
  merged = load_pretrained(tmp_path / "final_model")  # the merged export: a plain checkpoint
  assert merged.config.lora is None
  np.testing.assert_allclose(np.asarray(merged.logits(tokens)), adapted, rtol=1e-4, atol=1e-4)
  reloaded = load_pretrained(replying_model_dir, lora=model_config.lora, adapters=tmp_path / "final_adapters")
  for a, b in zip(jax.tree.leaves(reloaded.params), jax.tree.leaves(trainer.policy_params())):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _preempted_worker(model_dir, workdir):
  """PREEMPTED_RUN through the entry point; the end of its first iteration waits for the test's SIGTERM."""
  train_iteration = Trainer.train_iteration

  def until_sigterm(trainer):
    metrics = train_iteration(trainer)
    if trainer.iteration == 0:  # not yet counted
      print("iteration 1 waits for SIGTERM", flush=True)
      while not preemption.requested():
        time.sleep(0.01)
    return metrics

  Trainer.train_iteration = until_sigterm
  train_main(_config(model_dir, workdir, **PREEMPTED_RUN))


if __name__ == "__main__":
  _preempted_worker(sys.argv[1], sys.argv[2])
