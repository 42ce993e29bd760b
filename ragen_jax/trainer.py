"""The training loop: rollout → score → diagnose → learn, with validation, checkpoints and metrics.

`read_settings` validates every section of a config before anything is loaded; `Trainer.create`
builds the experiment (`assembly`) and the train state; `train` runs a whole config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from ragen_jax import mesh as mesh_lib
from ragen_jax import paths, preemption
from ragen_jax.assembly import (Experiment, ModelSettings, build_experiment, build_mesh, check_model_and_env,
                                check_process_split, load_reference)
from ragen_jax.checkpoint import Checkpointer, abstract_like
from ragen_jax.config import ConfigError, UserError, check, check_workdir
from ragen_jax.diagnostics.alarm import AlarmState, update_alarm
from ragen_jax.diagnostics.collapse import (CollapseConfig, init_diagnostics_state, make_diagnostics_fn,
                                            make_grad_analysis_fn, without_skipped)
from ragen_jax.models import lora
from ragen_jax.models.config import DTYPES
from ragen_jax.models.model import abstract_params, adapter_params, param_shardings
from ragen_jax.report.startup import model_source, startup_lines, write_parameter_table
from ragen_jax.report.summary import RUN_FILES, training_report
from ragen_jax.report.transcripts import decode_episodes, first_episodes
from ragen_jax.report.writer import WANDB_ID_FILE, MetricWriter, dump_json, json_ready
from ragen_jax.rl import early_stop
from ragen_jax.rl import update as update_lib
from ragen_jax.rl.presets import AlgorithmConfig
from ragen_jax.rl.snr_filter import FilterConfig
from ragen_jax.rollout.episodes import RolloutConfig, train_seeds
from ragen_jax.trajectories import Trajectories, rollout_metrics

DIAGNOSTIC_PREFIXES = ("collapse/", "grad_analysis/")  # logged under their own names, not update/
PROGRESS_METRICS = {"success": "train/success", "score": "train/score", "val_success": "val/success",
                    "kept": "update/filter_kept_ratio", "mi_z": "collapse/trajectory/mi_zscore"}  # progress bar
# what a training run writes into its workdir: `train.overwrite` deletes them (the compilation cache stays)
RUN_OUTPUTS = (*(name for name, _ in RUN_FILES), WANDB_ID_FILE, "wandb", "report.md", "report.png")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The `train` config section: batch, optimizer, validation and checkpoint settings (SPEC §2, §4)."""

  iterations: int = 400
  env_groups: int = 8
  group_size: int = 16
  seed_base: int = 10000
  mini_batch_size: int = 32
  micro_batch_size: int = 8
  ppo_epochs: int = 1
  actor_lr: float = 1e-6
  critic_lr: float = 1e-5
  beta1: float = 0.9
  beta2: float = 0.999
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  val_every: int = 10  # 0: no validation
  val_episodes: int = 512
  val_seed_start: int = 123
  val_transcripts: int = 4  # first validation episodes decoded into transcripts.jsonl and TensorBoard text
  checkpoint_every: int = 20
  max_to_keep: int = 3
  resume: bool = True  # continue from the workdir's newest checkpoint when it has one
  overwrite: bool = False  # with resume=False: delete the workdir's earlier run first (else such a run is refused)
  max_rejected_updates: int = 8  # halt after this many optimizer steps in a row rejected as non-finite
  # XLA's persistent compilation cache: "" = workdir/jax_cache (unless the process already has one, e.g. from
  # JAX_COMPILATION_CACHE_DIR), "none" = off, else a directory (local or gs://)
  compilation_cache: str = ""
  profile_steps: tuple[int, ...] = ()  # iterations (1-based) traced into workdir/profile for TensorBoard

  def __post_init__(self):
    object.__setattr__(self, "profile_steps", tuple(self.profile_steps))  # a ConfigDict may hand over a list
    for name in ("iterations", "env_groups", "group_size", "val_episodes", "max_to_keep", "max_rejected_updates"):
      check(f"train.{name}", getattr(self, name) >= 1, "must be >= 1", getattr(self, name))
    for name in ("val_every", "checkpoint_every", "val_transcripts"):
      check(f"train.{name}", getattr(self, name) >= 0, "must be >= 0 (0: never)", getattr(self, name))
    for name in ("actor_lr", "critic_lr", "grad_clip"):
      check(f"train.{name}", getattr(self, name) > 0, "must be > 0", getattr(self, name))
    check("train.overwrite", not (self.overwrite and self.resume), "deletes the earlier run for a fresh one; set "
          "train.resume=False with it", self.overwrite)
    check("train.profile_steps", all(step >= 1 for step in self.profile_steps), "iterations to trace, each >= 1",
          self.profile_steps)
    if self.compilation_cache not in ("", "none"):
      check_workdir(self.compilation_cache, "train.compilation_cache")

  def val_seeds(self) -> np.ndarray:
    """The fixed validation seeds."""
    return np.arange(self.val_seed_start, self.val_seed_start + self.val_episodes)

  def optimizer(self, lr: float) -> update_lib.OptimizerConfig:
    return update_lib.OptimizerConfig(lr=lr, beta1=self.beta1, beta2=self.beta2, weight_decay=self.weight_decay,
                                      grad_clip=self.grad_clip)


@dataclasses.dataclass(frozen=True)
class Settings:
  """Every training section of a config as its validated dataclass, and the update they make."""

  model: ModelSettings
  rollout: RolloutConfig
  algorithm: AlgorithmConfig
  filter: FilterConfig
  diagnostics: CollapseConfig
  early_stop: early_stop.EarlyStopConfig
  train: TrainConfig

  def update_config(self) -> update_lib.UpdateConfig:
    """The static settings of the update step these sections make."""
    train, algorithm = self.train, self.algorithm
    return update_lib.UpdateConfig(
        algorithm=algorithm, filter=self.filter, num_groups=train.env_groups, group_size=train.group_size,
        mini_batch_size=train.mini_batch_size, micro_batch_size=train.micro_batch_size, ppo_epochs=train.ppo_epochs,
        policy_optimizer=train.optimizer(train.actor_lr),
        critic_optimizer=train.optimizer(train.critic_lr) if algorithm.use_critic else None,
        diagnostics_fn=make_diagnostics_fn(self.diagnostics, train.env_groups, train.group_size),
        grad_analysis_fn=make_grad_analysis_fn(self.diagnostics, algorithm.loss, train.env_groups,
                                               train.micro_batch_size))


def read_settings(config) -> Settings:
  """Validates every section of a training config; a bad value raises a one-line ConfigError naming its key,
  before any model is loaded or compiled."""
  rollout = RolloutConfig(**config.rollout.to_dict())
  diagnostics = CollapseConfig(**config.diagnostics.to_dict())
  settings = Settings(
      model=ModelSettings(**config.model.to_dict()), rollout=rollout,
      algorithm=AlgorithmConfig(**config.algorithm.to_dict()),
      filter=FilterConfig(**config.filter.to_dict()),
      diagnostics=dataclasses.replace(diagnostics, max_reasoning_tokens=min(diagnostics.max_reasoning_tokens,
                                                                            rollout.max_new_tokens)),
      early_stop=early_stop.EarlyStopConfig(**config.early_stop.to_dict()), train=TrainConfig(**config.train.to_dict()))
  settings.update_config()  # the sections must also fit together (batch splits)
  check("model.reference_path", not settings.model.reference_path or settings.algorithm.use_kl_loss,
        "only the KL loss scores a reference: set algorithm.use_kl_loss=True", settings.model.reference_path)
  check_model_and_env(config)
  check_workdir(config.workdir)
  return settings


def initial_state(exp: Experiment, update: update_lib.UpdateConfig, seed: int) -> update_lib.TrainState:
  """Policy from the checkpoint, critic = policy trunk + zero value head, fresh optimizers. With LoRA the state
  holds the trained parts only (`lora.split`): the policy's adapters, and the critic's own fresh adapters and value
  head over the same frozen base."""
  config = exp.model.config
  copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))
  base, trainable = lora.split(config, exp.model.params)
  policy = copy(trainable)
  critic = None
  if update.algorithm.use_critic:
    abstract = abstract_params(config, with_value_head=True)["value_head"]
    shardings = param_shardings(config, exp.mesh, with_value_head=True)["value_head"]
    value_head = jax.tree.map(lambda a, s: jax.device_put(jnp.zeros(a.shape, a.dtype), s), abstract, shardings)
    trunk = copy(exp.model.params) if base is None else adapter_params(config, exp.mesh, seed=seed + 1)
    critic = {**trunk, "value_head": value_head}
  diagnostics = None if update.diagnostics_fn is None else init_diagnostics_state(update.diagnostics_fn.cfg)
  state = update_lib.init_train_state(update, policy, jax.random.PRNGKey(seed), critic, diagnostics)
  return mesh_lib.put_replicated_if_elsewhere(state, exp.mesh)


def reference_params(params, dtype: str):
  """The frozen reference model's weights: the loaded ones themselves, or a copy cast to `dtype` in the same
  shardings (a bfloat16 reference of float32 weights costs half a copy)."""
  target = DTYPES[dtype]
  if all(x.dtype == target for x in jax.tree.leaves(params)):
    return params
  shardings = jax.tree.map(lambda x: x.sharding, params)
  return jax.jit(lambda tree: jax.tree.map(lambda x: x.astype(target), tree), out_shardings=shardings)(params)


def earlier_run(workdir: str) -> list[str]:
  """The files of a training run (`RUN_OUTPUTS`) that `workdir` already holds."""
  return [name for name in paths.listdir(workdir) if name in RUN_OUTPUTS] if paths.isdir(workdir) else []


def use_compilation_cache(setting: str, workdir: str) -> None:
  """Points JAX's persistent compilation cache at `train.compilation_cache` (`setting`) of a run in `workdir`;
  call it before the process first compiles (JAX opens its cache once)."""
  if setting == "none":
    jax.config.update("jax_enable_compilation_cache", False)
  elif setting or not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", setting or paths.join(workdir, "jax_cache"))
  if jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir:
    logging.info("compilation cache: %s", jax.config.jax_compilation_cache_dir)


class Profiler:
  """Traces the iterations `steps` (1-based; a run of consecutive ones is one trace) into `directory` for
  TensorBoard's profile tab (`plugins/profile/<time>/`; on `gs://` uploaded when each trace ends)."""

  def __init__(self, steps: tuple[int, ...], directory: str, enabled: bool = True):
    self.steps, self.directory = set(steps) if enabled else set(), directory
    self._trace: contextlib.ExitStack | None = None

  def before(self, iteration: int) -> None:
    """Call before running iteration `iteration`."""
    if iteration in self.steps and self._trace is None:
      self._trace = contextlib.ExitStack()
      jax.profiler.start_trace(self._trace.enter_context(paths.writing_dir(self.directory)))

  def after(self, iteration: int) -> None:
    """Call after iteration `iteration` finished."""
    if iteration + 1 not in self.steps:
      self.close()

  def close(self) -> None:
    if self._trace is not None:
      jax.profiler.stop_trace()
      self._trace.close()
      self._trace = None


class TrainingHalted(UserError):
  """Too many optimizer steps in a row were rejected as non-finite; the weights are those of the last good one."""


class Trainer:
  """Holds the experiment, the train state and the host-side loop state; `run()` returns the final metrics."""

  def __init__(self, exp: Experiment, settings: Settings):
    self.exp, self.settings, self.update_config = exp, settings, settings.update_config()
    self.workdir = exp.config.workdir
    self.is_main = jax.process_index() == 0
    self.state = initial_state(exp, self.update_config, exp.config.seed)
    self.base = lora.split(exp.model.config, exp.model.params)[0]  # frozen weights under LoRA adapters, or None
    if self.base is not None:
      shardings = jax.tree.map(lambda x: x.sharding, self.base)
      self._merge = jax.jit(lambda base, adapters: lora.merge(exp.model.config, lora.combine(base, adapters)),
                            out_shardings=shardings)
    self.ref_params = None
    if settings.algorithm.use_kl_loss:  # by default the starting weights: under LoRA the base with adapters off
      reference = (load_reference(settings.model, exp.model, exp.tokenizer) if settings.model.reference_path
                   else exp.model.params if self.base is None else self.base)
      self.ref_params = reference_params(reference, settings.model.reference_dtype)
    self.checkpointer = Checkpointer(paths.join(self.workdir, "checkpoints"), settings.train.checkpoint_every,
                                     settings.train.max_to_keep)
    self.iteration = 0
    self.stop_state = early_stop.EarlyStopState()
    self.alarm_state = AlarmState()
    self.best_val_success = -1.0
    self.rejected_streak = 0  # optimizer steps in a row rejected as non-finite (`update.learn`)
    self.last_validation: Trajectories | None = None

  @classmethod
  def create(cls, config) -> Trainer:
    """Validates `config` (`read_settings`) and the workdir (a fresh run into an earlier one's is refused unless
    `train.overwrite`, which deletes the earlier run's files), then builds the experiment and the trainer."""
    settings = read_settings(config)
    train = settings.train
    earlier = earlier_run(config.workdir)  # read by every process before any of them joins the others
    if earlier and not train.resume and not train.overwrite:
      raise ConfigError(f"workdir={config.workdir!r} holds an earlier run ({', '.join(earlier)}): set "
                        f"train.overwrite=True to delete it, train.resume=True to continue it, or choose another "
                        f"workdir")
    use_compilation_cache(train.compilation_cache, config.workdir)
    mesh = build_mesh(config, train.env_groups * train.group_size)
    if earlier and train.overwrite:
      if jax.process_index() == 0:
        for name in earlier:
          paths.remove_tree(paths.join(config.workdir, name))
        logging.info("train.overwrite: deleted the earlier run's %s in %s", ", ".join(earlier), config.workdir)
      if jax.process_count() > 1:
        multihost_utils.sync_global_devices("ragen_jax earlier run deleted")
    if train.val_every:
      check_process_split(mesh, f"train.val_episodes={train.val_episodes}", train.val_episodes)
    return cls(build_experiment(config, settings.rollout, mesh), settings)

  # ---- phases -------------------------------------------------------------
  def policy_params(self) -> dict:
    """All the current policy's params (with LoRA, the frozen base and the trained adapters in one tree)."""
    return lora.combine(self.base, self.state.policy)

  def rollout_params(self) -> dict:
    """The policy's weights as the sampler decodes with them: LoRA adapters merged into their kernels (a copy of
    the base weights in their shardings, made once per rollout); without LoRA, the policy itself."""
    if self.base is None:
      return self.state.policy
    return self._merge(self.base, self.state.policy)

  def validation_rollout(self, source=None) -> Trajectories:
    """One episode per fixed validation seed, with the same sampling key every time; `source`: another rollout
    source of this policy (`assembly.build_source`, e.g. of held-out env params), default the training one."""
    seeds = self.settings.train.val_seeds()
    return (source or self.exp.source).run(self.rollout_params(), seeds, np.arange(len(seeds)),
                                           jax.random.PRNGKey(self.settings.train.val_seed_start), split="validation")

  def validate(self) -> dict[str, float]:
    """Validation metrics; the trajectories are kept in `last_validation`."""
    self.last_validation = self.validation_rollout()
    return rollout_metrics(self.last_validation, "val")

  def validation_transcripts(self) -> list[dict]:
    """The first `train.val_transcripts` episodes of the last validation, decoded (`report.transcripts`; a gather:
    call it from every process, only process 0 gets them)."""
    count = min(self.settings.train.val_transcripts, self.settings.train.val_episodes)
    if not count:
      return []
    episodes = first_episodes(self.last_validation, count)
    if not self.is_main:
      return []
    return decode_episodes(self.exp.source, self.exp.tokenizer, episodes, self.settings.train.val_seeds()[:count])

  def train_iteration(self) -> dict[str, float]:
    exp, cfg, update = self.exp, self.settings.train, self.update_config
    seeds = train_seeds(self.iteration, cfg.env_groups, cfg.group_size, cfg.seed_base)
    group_ids = np.repeat(np.arange(cfg.env_groups), cfg.group_size)
    key = jax.random.fold_in(jax.random.PRNGKey(exp.config.seed), self.iteration)
    model_config = exp.model.config
    times = {}
    clock = time.perf_counter()

    def finish(phase, result):
      nonlocal clock
      result = jax.block_until_ready(result)
      now = time.perf_counter()
      times[f"time/{phase}_s"] = now - clock
      clock = now
      return result

    traj = finish("rollout", exp.source.run(self.rollout_params(), seeds, group_ids, key))
    with jax.set_mesh(exp.mesh):
      scores = finish("scoring", update_lib.score(model_config, update, self.state, self.ref_params, traj, self.base))
      self.state, diag_metrics = finish("diagnostics", update_lib.diagnose(model_config, update, self.state, traj,
                                                                           scores, self.base))
      self.state, metrics = finish("update", update_lib.learn(model_config, update, self.state, traj, scores,
                                                              self.base))
      metrics = without_skipped(mesh_lib.fetch(diag_metrics | metrics), self.settings.diagnostics)
    tail = int(metrics.pop("rejected_tail"))
    self.rejected_streak = tail if metrics["num_updates"] > 0 else self.rejected_streak + tail
    metrics["rejected_streak"] = self.rejected_streak
    out = rollout_metrics(traj, "train") | {
        (k if k.startswith(DIAGNOSTIC_PREFIXES) else f"update/{k}"): float(v) for k, v in metrics.items()}
    out |= times | {"time/iteration_s": sum(times.values())}
    return out

  # ---- persistence ----------------------------------------------------------
  def export_policy(self, out_dir: str) -> None:
    """Writes the policy as a transformers-loadable directory (LoRA adapters merged) and, with LoRA, the adapters
    alone in PEFT's layout to `out_dir`'s sibling `final_adapters/` (a gather: call it from every process)."""
    policy = mesh_lib.fetch(self.policy_params())
    if not self.is_main:
      return
    model = dataclasses.replace(self.exp.model, params=policy)
    model.export(out_dir, self.exp.tokenizer)
    if model.config.lora is not None:
      lora.save_adapters(model.config, policy, paths.join(paths.parent(out_dir), "final_adapters"),
                         base_model=self.exp.config.model.path)

  def host_state(self) -> dict:
    return {"iteration": self.iteration, "early_stop": self.stop_state.to_dict(),
            "alarm": self.alarm_state.to_dict(), "best_val_success": self.best_val_success,
            "rejected_streak": self.rejected_streak}

  def try_resume(self) -> bool:
    """Restores the newest checkpoint that restores (`Checkpointer.restore_latest`); False when there is none."""
    restored = self.checkpointer.restore_latest(abstract_like(self.state))
    if restored is None:
      return False
    _, self.state, host = restored
    self.iteration = host["iteration"]
    self.stop_state = early_stop.EarlyStopState.from_dict(host["early_stop"])
    self.alarm_state = AlarmState.from_dict(host["alarm"])
    self.best_val_success = host["best_val_success"]
    self.rejected_streak = host.get("rejected_streak", 0)
    return True

  # ---- loop -----------------------------------------------------------------
  def run(self, iterations: int | None = None) -> dict[str, float]:
    """Trains up to `iterations` (default `train.iterations`); returns the last iteration's metrics.

    Raises ConfigError before any work when a fresh run (nothing resumed) finds checkpoints in its workdir,
    TrainingHalted after `train.max_rejected_updates` rejected steps in a row (that iteration's metrics written),
    and `preemption.Preempted` after the iteration during which a SIGTERM came (`preemption.sigterm_requests_stop`),
    its checkpoint saved.
    """
    cfg, train = self.exp.config, self.settings.train
    total = train.iterations if iterations is None else iterations
    if self.iteration == 0 and self.checkpointer.steps():
      raise ConfigError(f"{self.checkpointer.directory} already holds checkpoints of iterations "
                        f"{self.checkpointer.steps()}: resume from them first (Trainer.try_resume, as `train` does), "
                        f"or choose another workdir")
    writer = MetricWriter(self.workdir, cfg.logging.tensorboard,
                          cfg.logging.wandb_project if cfg.logging.wandb else None, cfg.to_dict(), self.is_main,
                          start_step=self.iteration)
    if self.iteration < total:
      logging.info("compiling: iteration %d first compiles the rollout, scoring and update programs (and the first "
                   "validation its rollout)", self.iteration + 1)
    progress = _progress(total, self.iteration, cfg.logging.progress_bar and self.is_main, cfg.env.name)
    profiler = Profiler(train.profile_steps, paths.join(self.workdir, "profile"), self.is_main)
    last: dict[str, float] = {}
    try:
      while self.iteration < total:
        profiler.before(self.iteration + 1)
        metrics = self.train_iteration()
        self.iteration += 1
        if train.val_every and (self.iteration % train.val_every == 0 or self.iteration == total):
          metrics |= self.validate()
          self.best_val_success = max(self.best_val_success, metrics["val/success"])
          writer.write_transcripts(self.iteration, self.validation_transcripts())
        reason = self._watch(metrics)
        writer.write(self.iteration, metrics)
        if self.rejected_streak >= train.max_rejected_updates:
          saved = self.checkpointer.steps()
          raise TrainingHalted(
              f"{self.rejected_streak} optimizer steps in a row had a non-finite loss or gradient norm and were not "
              f"applied (train.max_rejected_updates={train.max_rejected_updates}); the weights are those of the last "
              f"finite step, " + (f"the newest checkpoint is of iteration {saved[-1]}" if saved else
                                  "no checkpoint was saved yet") +
              f"; lower train.actor_lr or look at update/ metrics in {self.workdir}")
        final = train.checkpoint_every > 0 and self.iteration == total  # the final state is always saved
        preempted = not reason and preemption.requested()  # an early-stopped run finishes instead
        self.checkpointer.maybe_save(self.iteration, self.state, self.host_state(),
                                     force=bool(reason) or final or preempted)
        profiler.after(self.iteration)
        progress.update(1)
        progress.set_postfix({label: f"{metrics[key]:.3g}" for label, key in PROGRESS_METRICS.items()
                              if key in metrics}, refresh=False)
        if preempted:
          saved = self.checkpointer.steps()
          logging.warning("preempted (SIGTERM) after iteration %d; the newest checkpoint is of iteration %s; exiting "
                          "with code %d for a restart to resume", self.iteration, saved[-1] if saved else None,
                          preemption.PREEMPTED_EXIT_CODE)
          raise preemption.Preempted(f"preempted after iteration {self.iteration}")
        last = metrics
        if reason:
          logging.warning("early stop at iteration %d: %s", self.iteration, reason)
          last["early_stop"] = 1.0
          break
    finally:
      profiler.close()
      progress.close()
      writer.close()
      self.checkpointer.wait()  # the last save is on disk when run() returns or raises
    return last

  def _watch(self, metrics: dict[str, float]) -> str | None:
    """Early-stopping rules and the template-collapse alarm; returns a stop reason or None."""
    stop_cfg = self.settings.early_stop
    filter_empty = bool(metrics.get("update/filter_empty", 0.0))
    self.stop_state, reason = early_stop.after_iteration(
        self.stop_state, stop_cfg, filter_empty=filter_empty,
        in_group_reward_std=metrics.get("update/in_group_reward_std", 0.0))
    if "val/success" in metrics and reason is None:
      self.stop_state, reason = early_stop.after_validation(self.stop_state, stop_cfg, success=metrics["val/success"],
                                                            filter_empty=filter_empty)
    zscore = metrics.get("collapse/trajectory/mi_zscore")
    if zscore is not None and metrics.get("collapse/computed", 1.0):
      self.alarm_state, alarm = update_alarm(self.alarm_state, self.settings.diagnostics, zscore,
                                             metrics.get("update/policy_entropy", float("nan")),
                                             metrics.get("collapse/trajectory/mi_estimate", float("nan")))
      metrics["collapse/alarm"] = float(alarm.fired)
      if alarm.fired:
        logging.warning("iteration %d: %s", self.iteration, alarm.message)
    return reason


def _progress(total: int, initial: int, enabled: bool, desc: str):
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True)


def log_startup(trainer: Trainer) -> None:
  """Process 0 logs the model, its size, the devices, the mesh and the run's shape, and writes the parameter
  table into the workdir."""
  if not trainer.is_main:
    return
  exp, train_cfg = trainer.exp, trainer.settings.train
  table = write_parameter_table(exp.model.params, trainer.workdir)
  validation = (f"validation on {train_cfg.val_episodes} seeds every {train_cfg.val_every} iterations"
                if train_cfg.val_every else "no validation")
  for line in startup_lines(exp, table) + [
      f"run: {train_cfg.iterations} iterations of {train_cfg.env_groups} groups x {train_cfg.group_size} "
      f"{exp.config.env.name} episodes ({trainer.settings.algorithm.preset}), {validation}; writing to "
      f"{trainer.workdir}"]:
    logging.info(line)


def write_training_report(trainer: Trainer, metrics: dict[str, float], halted: TrainingHalted | None = None) -> str:
  """`report.md` and `report.png` in the workdir (process 0), saying why a `halted` run stopped; returns the
  report's path."""
  cfg, train_cfg, settings = trainer.exp.config, trainer.settings.train, trainer.settings
  description = [f"Model: {model_source(cfg.model.path)}. {trainer.iteration} of {train_cfg.iterations} iterations "
                 f"of {train_cfg.env_groups} groups x {train_cfg.group_size} episodes, algorithm "
                 f"{settings.algorithm.preset}, SNR filter {'on' if settings.filter.enabled else 'off'}; "
                 f"validation on {train_cfg.val_episodes} fixed seeds."]
  if metrics.get("early_stop"):
    description.append(f"The run stopped early at iteration {trainer.iteration} (see the log).")
  if halted:
    description.append(f"The run halted at iteration {trainer.iteration}: {halted}")
  if trainer.best_val_success >= 0:
    description.append(f"Best validation success: {trainer.best_val_success:.3f}.")
  return training_report(trainer.workdir, f"ragen_jax training report: {cfg.env.name}", description)


def train(config) -> dict[str, float]:
  """Builds the trainer, resumes from the workdir's newest checkpoint (`train.resume`), trains, exports the final
  policy and writes the report."""
  trainer = Trainer.create(config)
  log_startup(trainer)
  if trainer.settings.train.resume and trainer.try_resume():
    logging.info("resuming from the checkpoint of iteration %d in %s", trainer.iteration,
                 trainer.checkpointer.directory)
  try:
    metrics = trainer.run()
  except TrainingHalted as halted:  # the iterations it logged still get their report; nothing is exported
    if trainer.is_main:
      logging.info("report: %s", write_training_report(trainer, {}, halted))
    raise
  finally:
    trainer.checkpointer.close()  # the last save finishes, also when the run stops on an error or a SIGTERM
  trainer.export_policy(paths.join(config.workdir, "final_model"))  # a gather every process takes part in
  if trainer.is_main:
    dump_json(json_ready(metrics), paths.join(config.workdir, "final_metrics.json"))
    logging.info("report: %s", write_training_report(trainer, metrics))
  return metrics
