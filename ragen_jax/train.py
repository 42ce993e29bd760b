"""Training entry point: rollout → score → filter → update, with validation and checkpoints.

  python -m ragen_jax.train --config=configs/NAME.py [--config.x=y ...]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import transformers

import envs
from envs import host as host_envs
from ragen_jax import config as config_lib
from ragen_jax import distributed
from ragen_jax import mesh as mesh_lib
from ragen_jax.checkpoint import Checkpointer, abstract_like
from ragen_jax.diagnostics.alarm import AlarmConfig, AlarmState, update_alarm
from ragen_jax.diagnostics.collapse import (CollapseConfig, init_diagnostics_state, make_diagnostics_fn,
                                            make_grad_analysis_fn, without_skipped)
from ragen_jax.models import Model, bundled_model_dir, load_pretrained
from ragen_jax.models.model import abstract_params, input_sharding, param_shardings
from ragen_jax.report.writer import MetricWriter
from ragen_jax.rl import early_stop
from ragen_jax.rl.losses import PolicyLossConfig
from ragen_jax.rl.presets import preset
from ragen_jax.rl.update import FilterConfig, TrainState, UpdateConfig, init_train_state, make_update_fn
from ragen_jax.rollout.device import device_rollout, slot_layout
from ragen_jax.rollout.episodes import RolloutConfig, build_assets, train_seeds
from ragen_jax.rollout.text import text_rollout
from ragen_jax.sampling import SamplingRule
from ragen_jax.trajectories import Trajectories

CONTEXT_MODES = ("full", "limited_multi_turn", "single_turn")
DIAGNOSTIC_PREFIXES = ("collapse/", "grad_analysis/")  # logged under their own names, not update/
SUMMARY_FIELDS = ("success", "score", "num_turns", "response_start", "format_ok", "num_actions", "loss_mask",
                  "reasoning_len")  # what `rollout_metrics` reads


@dataclasses.dataclass
class Experiment:
  """Everything built from a config before the loop starts (all settings already validated)."""

  config: object
  mesh: jax.sharding.Mesh
  model: Model
  tokenizer: object
  env: object            # a pure-JAX environment, or None for a host text environment
  env_params: object
  make_text_env: object  # () -> a fresh host text environment (Countdown, math, code), or None
  rollout: RolloutConfig
  val_rollout: RolloutConfig
  assets: object
  update_config: UpdateConfig
  policy_tx: optax.GradientTransformation
  critic_tx: optax.GradientTransformation | None
  early_stop: early_stop.EarlyStopConfig
  alarm: AlarmConfig
  collapse: CollapseConfig

  @property
  def seq_len(self) -> int:
    if self.env is None:
      return self.config.rollout.max_episode_len
    return slot_layout(self.assets, self.rollout)[2]


def algorithm_from_config(cfg):
  """The preset named in `cfg.preset` with the loss and GAE settings of `cfg`."""
  base = preset(cfg.preset)
  loss = dataclasses.replace(base.loss, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                             dual_clip=cfg.dual_clip if cfg.dual_clip else None, entropy_coef=cfg.entropy_coef,
                             use_kl_loss=cfg.use_kl_loss, kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator)
  PolicyLossConfig(**dataclasses.asdict(loss))  # validates
  return dataclasses.replace(base, loss=loss, gamma=cfg.gamma, lam=cfg.lam, bi_level_gae=cfg.bi_level_gae,
                             turn_gamma=cfg.turn_gamma)


def rollout_config_from(config) -> RolloutConfig:
  """The training rollout settings of a config."""
  rule = SamplingRule(config.rollout.temperature, config.rollout.top_k, config.rollout.top_p)
  mode = config.rollout.context_window_mode
  if mode not in CONTEXT_MODES:
    raise config_lib.ConfigError(f"rollout.context_window_mode {mode!r} is not one of {CONTEXT_MODES}")
  if mode == "limited_multi_turn" and config.rollout.max_context_window < 1:
    raise config_lib.ConfigError(f"rollout.max_context_window must be >= 1 turn for limited_multi_turn, got "
                                 f"{config.rollout.max_context_window}")
  context_turns = {"full": 0, "single_turn": 1, "limited_multi_turn": config.rollout.max_context_window}[mode]
  return RolloutConfig(max_turns=config.rollout.max_turns, max_new_tokens=config.rollout.max_new_tokens,
                       max_actions_per_turn=config.rollout.max_actions_per_turn,
                       max_actions_per_traj=config.rollout.max_actions_per_traj,
                       format_penalty=config.rollout.format_penalty, rule=rule, context_turns=context_turns,
                       max_context_tokens=config.rollout.max_model_len)


def collapse_config_from(cfg, max_new_tokens: int) -> CollapseConfig:
  """The collapse-diagnostics settings of a config's `diagnostics` block."""
  return CollapseConfig(enabled=cfg.enabled, compute_freq=cfg.compute_freq, num_samples=cfg.num_samples,
                        marginal=cfg.marginal, max_reasoning_tokens=min(cfg.max_reasoning_tokens, max_new_tokens),
                        grad_analysis=cfg.grad_analysis, num_buckets=cfg.num_buckets,
                        bucket_mode=cfg.bucket_mode)


def _optimizer(lr: float, cfg) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                     optax.adamw(lr, b1=cfg.beta1, b2=cfg.beta2, weight_decay=cfg.weight_decay))


def build_experiment(config) -> Experiment:
  """Validates the config and builds models, envs, tables and optimizers (nothing compiled yet).

  With `distributed.enabled`, first joins the other processes (jax.distributed); the mesh then spans all of them.
  """
  distributed.initialize(config.distributed)
  env_overrides = config.env.params.to_dict()
  if config.env.name in host_envs.REGISTRY:
    host_envs.make_text_env(config.env.name, **env_overrides)  # fails early on bad settings
    env, env_params = None, None
    make_text_env = functools.partial(host_envs.make_text_env, config.env.name, **env_overrides)
  else:
    env, env_params = envs.make(config.env.name, **env_overrides)
    make_text_env = None
  rollout = rollout_config_from(config)
  val_rollout = dataclasses.replace(rollout, rule=SamplingRule(config.rollout.val_temperature))
  algorithm = algorithm_from_config(config.algorithm)
  update_config = UpdateConfig(
      algorithm=algorithm, filter=FilterConfig(**config.filter.to_dict()), num_groups=config.train.env_groups,
      group_size=config.train.group_size, mini_batch_size=config.train.mini_batch_size,
      micro_batch_size=config.train.micro_batch_size, ppo_epochs=config.train.ppo_epochs,
      value_clip=config.algorithm.value_clip)
  stop_cfg = early_stop.EarlyStopConfig(**config.early_stop.to_dict())
  alarm = AlarmConfig(window=config.diagnostics.alarm_window, drop=config.diagnostics.alarm_drop,
                      entropy_tolerance=config.diagnostics.alarm_entropy_tolerance,
                      min_drop=config.diagnostics.alarm_min_drop)
  collapse = collapse_config_from(config.diagnostics, config.rollout.max_new_tokens)

  mesh = mesh_lib.mesh_from_config(config.mesh)
  batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
  if update_config.batch_size % batch_shards:
    raise config_lib.ConfigError(f"the batch of {update_config.batch_size} episodes does not divide over "
                                 f"{batch_shards} data x fsdp shards of the mesh")
  if jax.process_count() > 1:
    _check_multi_process(config, mesh, batch_shards)
  path = config.model.path or str(bundled_model_dir())
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  model = load_pretrained(path, mesh=mesh, dtype=config.model.dtype, param_dtype=config.model.param_dtype)
  if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in model.config.eos_token_ids:
    model = dataclasses.replace(model, config=dataclasses.replace(
        model.config, eos_token_ids=model.config.eos_token_ids + (tokenizer.eos_token_id,)))
  assets = None if env is None else build_assets(tokenizer, env, env_params, rollout,
                                                 table_size=model.config.vocab_size)
  critic_tx = _optimizer(config.train.critic_lr, config.train) if algorithm.use_critic else None
  return Experiment(config=config, mesh=mesh, model=model, tokenizer=tokenizer, env=env, env_params=env_params,
                    make_text_env=make_text_env,
                    rollout=rollout, val_rollout=val_rollout, assets=assets, update_config=update_config,
                    policy_tx=_optimizer(config.train.actor_lr, config.train), critic_tx=critic_tx,
                    early_stop=stop_cfg, alarm=alarm, collapse=collapse)


def _check_multi_process(config, mesh: jax.sharding.Mesh, batch_shards: int):
  """Each process places its slice of every batch on its own devices of a mesh over all devices."""
  processes = jax.process_count()
  if mesh.size != jax.device_count():
    raise config_lib.ConfigError(f"mesh.num_devices={config.mesh.num_devices}: with {processes} processes the mesh "
                                 f"must span all {jax.device_count()} devices (-1)")
  if config.env.name in host_envs.REGISTRY:
    raise config_lib.ConfigError(f"env {config.env.name!r} is a host text environment, whose rollout is not split "
                                 f"over processes yet; run it as one process (any number of local devices)")
  if config.train.val_every and config.train.val_episodes % batch_shards:
    raise config_lib.ConfigError(f"train.val_episodes={config.train.val_episodes} does not divide over "
                                 f"{batch_shards} data x fsdp shards of the mesh (needed with {processes} processes)")


def initial_state(exp: Experiment) -> TrainState:
  """Policy from the checkpoint, critic = policy trunk + zero value head, fresh optimizers."""
  copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))
  policy = copy(exp.model.params)
  critic = None
  if exp.critic_tx is not None:
    abstract = abstract_params(exp.model.config, with_value_head=True)["value_head"]
    shardings = param_shardings(exp.model.config, exp.mesh, with_value_head=True)["value_head"]
    value_head = jax.tree.map(lambda a, s: jax.device_put(jnp.zeros(a.shape, a.dtype), s), abstract, shardings)
    critic = {**copy(exp.model.params), "value_head": value_head}
  key = jax.random.PRNGKey(exp.config.seed)
  diagnostics = init_diagnostics_state(exp.collapse) if exp.collapse.enabled else None
  state = init_train_state(policy, exp.policy_tx, key, critic, exp.critic_tx, diagnostics)
  return mesh_lib.put_replicated_if_elsewhere(state, exp.mesh)


def _batch_put(exp: Experiment, array):
  return mesh_lib.put_global(array, input_sharding(exp.mesh, np.shape(array)))


def rollout_metrics(traj: Trajectories, prefix: str) -> dict[str, float]:
  """Host summary of a trajectory batch (gathered from every process: call it from all of them)."""
  t = mesh_lib.fetch({name: getattr(traj, name) for name in SUMMARY_FIELDS})
  turns = np.maximum(t["num_turns"], 1)
  played = max(np.sum(t["response_start"] >= 0), 1)
  return {f"{prefix}/success": float(np.mean(t["success"])), f"{prefix}/score": float(np.mean(t["score"])),
          f"{prefix}/num_turns": float(np.mean(t["num_turns"])),
          f"{prefix}/valid_action_rate": float(np.sum(t["format_ok"]) / played),
          f"{prefix}/actions_per_turn": float(np.mean(t["num_actions"] / turns)),
          f"{prefix}/response_length": float(np.sum(t["loss_mask"]) / played),
          f"{prefix}/valid_thinking_rate": float(np.sum(t["reasoning_len"] > 0) / played)}


_UPDATE_PHASES: dict = {}  # what the jitted phases depend on -> (score, diagnose, learn)


def _update_phases(exp: Experiment, state_shardings):
  """The jitted score, diagnose and learn phases of `exp`'s update.

  Trainers of one process whose phases would be the same programs share one set of jits (a resumed run, the
  seeds of `make compare`), so each program is traced and compiled once per process.
  """
  shardings, tree = jax.tree.flatten(state_shardings)
  key = (exp.model.config, exp.update_config, exp.collapse, exp.config.train.to_json(), tree, tuple(shardings))
  if key not in _UPDATE_PHASES:
    update_cfg = exp.update_config
    diagnostics_fn = make_diagnostics_fn(exp.model.config, exp.collapse, update_cfg.num_groups, update_cfg.group_size)
    grad_analysis_fn = make_grad_analysis_fn(exp.model.config, exp.collapse, update_cfg.algorithm.loss,
                                             update_cfg.num_groups, update_cfg.micro_batch_size)
    update = make_update_fn(exp.model.config, update_cfg, exp.policy_tx, exp.critic_tx, diagnostics_fn,
                            grad_analysis_fn)
    _UPDATE_PHASES[key] = (
        jax.jit(update.score),
        jax.jit(update.diagnose, out_shardings=(state_shardings, None), donate_argnums=(0,)),
        jax.jit(update.learn, out_shardings=(state_shardings, None), donate_argnums=(0,)))
  return _UPDATE_PHASES[key]


class Trainer:
  """Owns the jitted functions and runs the loop; `run()` returns the final metrics."""

  def __init__(self, exp: Experiment):
    self.exp = exp
    self.workdir = exp.config.workdir
    self.is_main = jax.process_index() == 0
    self.state = initial_state(exp)
    self.ref_params = exp.model.params if exp.update_config.algorithm.loss.use_kl_loss else None
    self._score, self._diagnose, self._learn = _update_phases(exp, jax.tree.map(lambda x: x.sharding, self.state))
    self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"), exp.config.train.checkpoint_every,
                                     exp.config.train.max_to_keep)
    self.iteration = 0
    self.stop_state = early_stop.EarlyStopState()
    self.alarm_state = AlarmState()
    self.best_val_success = -1.0
    self.last_validation: Trajectories | None = None

  # ---- phases -------------------------------------------------------------
  def rollout(self, seeds, group_size: int, config: RolloutConfig, key, params=None,
              split: str = "train") -> Trajectories:
    exp = self.exp
    group_ids = np.repeat(np.arange(len(seeds) // group_size), group_size)
    params = self.state.policy if params is None else params
    if exp.env is None:
      model = dataclasses.replace(exp.model, params=params)
      traj = text_rollout(model, exp.tokenizer, exp.make_text_env, config, seeds, group_ids, key, exp.seq_len, split)
      return jax.tree.map(functools.partial(_batch_put, exp), traj)
    with jax.set_mesh(exp.mesh):
      return device_rollout(exp.model.config, params, exp.env,
                            exp.env_params, exp.assets, config, _batch_put(exp, np.asarray(seeds, np.int32)),
                            _batch_put(exp, group_ids), key)

  def validation_rollout(self) -> Trajectories:
    """One episode per fixed validation seed, with the same sampling key every time."""
    cfg = self.exp.config.train
    seeds = np.arange(cfg.val_seed_start, cfg.val_seed_start + cfg.val_episodes)
    return self.rollout(seeds, 1, self.exp.val_rollout, jax.random.PRNGKey(cfg.val_seed_start), split="validation")

  def validate(self) -> dict[str, float]:
    """Validation metrics; the trajectories are kept in `last_validation`."""
    self.last_validation = self.validation_rollout()
    return rollout_metrics(self.last_validation, "val")

  def train_iteration(self) -> dict[str, float]:
    exp, cfg = self.exp, self.exp.config.train
    seeds = train_seeds(self.iteration, cfg.env_groups, cfg.group_size, cfg.seed_base)
    key = jax.random.fold_in(jax.random.PRNGKey(exp.config.seed), self.iteration)
    times = {}
    clock = time.perf_counter()

    def finish(phase, result):
      nonlocal clock
      result = jax.block_until_ready(result)
      now = time.perf_counter()
      times[f"time/{phase}_s"] = now - clock
      clock = now
      return result

    traj = finish("rollout", self.rollout(seeds, cfg.group_size, exp.rollout, key))
    with jax.set_mesh(exp.mesh):
      scores = finish("scoring", self._score(self.state, self.ref_params, traj))
      self.state, diag_metrics = finish("diagnostics", self._diagnose(self.state, traj, scores))
      self.state, metrics = finish("update", self._learn(self.state, traj, scores))
      metrics = without_skipped(mesh_lib.fetch(diag_metrics | metrics), exp.collapse)
    out = rollout_metrics(traj, "train") | {
        (k if k.startswith(DIAGNOSTIC_PREFIXES) else f"update/{k}"): float(v) for k, v in metrics.items()}
    out |= times | {"time/iteration_s": sum(times.values())}
    return out

  # ---- persistence ----------------------------------------------------------
  def host_state(self) -> dict:
    return {"iteration": self.iteration, "early_stop": self.stop_state.to_dict(),
            "alarm": self.alarm_state.to_dict(), "best_val_success": self.best_val_success}

  def try_resume(self) -> bool:
    restored = self.checkpointer.restore_latest(abstract_like(self.state))
    if restored is None:
      return False
    _, self.state, host = restored
    self.iteration = host["iteration"]
    self.stop_state = early_stop.EarlyStopState.from_dict(host["early_stop"])
    self.alarm_state = AlarmState.from_dict(host["alarm"])
    self.best_val_success = host["best_val_success"]
    return True

  # ---- loop -----------------------------------------------------------------
  def run(self, iterations: int | None = None) -> dict[str, float]:
    cfg = self.exp.config
    total = cfg.train.iterations if iterations is None else iterations
    writer = MetricWriter(self.workdir, cfg.logging.tensorboard,
                          cfg.logging.wandb_project if cfg.logging.wandb else None, cfg.to_dict(), self.is_main)
    progress = _progress(total, self.iteration, cfg.logging.progress_bar and self.is_main, cfg.env.name)
    last: dict[str, float] = {}
    try:
      while self.iteration < total:
        metrics = self.train_iteration()
        self.iteration += 1
        if cfg.train.val_every and (self.iteration % cfg.train.val_every == 0 or self.iteration == total):
          metrics |= self.validate()
          self.best_val_success = max(self.best_val_success, metrics["val/success"])
        reason = self._watch(metrics)
        writer.write(self.iteration, metrics)
        self.checkpointer.maybe_save(self.iteration, self.state, self.host_state(), force=bool(reason))
        progress.update(1)
        progress.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in (
            "train/success", "train/score", "val/success", "update/filter_kept_ratio",
            "collapse/trajectory/mi_zscore") if k in metrics}, refresh=False)
        last = metrics
        if reason:
          logging.warning("early stop at iteration %d: %s", self.iteration, reason)
          last["early_stop"] = 1.0
          break
    finally:
      progress.close()
      writer.close()
    return last

  def _watch(self, metrics: dict[str, float]) -> str | None:
    """Early-stopping rules and the template-collapse alarm; returns a stop reason or None."""
    self.stop_state, reason = early_stop.after_iteration(
        self.stop_state, self.exp.early_stop, filter_empty=bool(metrics.get("update/filter_empty", 0.0)),
        in_group_reward_std=metrics.get("update/in_group_reward_std", 0.0))
    if "val/success" in metrics and reason is None:
      self.stop_state, reason = early_stop.after_validation(self.stop_state, self.exp.early_stop,
                                                            metrics["val/success"])
    zscore = metrics.get("collapse/trajectory/mi_zscore")
    if zscore is not None and metrics.get("collapse/computed", 1.0):
      self.alarm_state, alarm = update_alarm(self.alarm_state, self.exp.alarm, zscore,
                                             metrics.get("update/policy_entropy", float("nan")))
      metrics["collapse/alarm"] = float(alarm.fired)
      if alarm.fired:
        logging.warning("iteration %d: %s", self.iteration, alarm.message)
    return reason


def _progress(total: int, initial: int, enabled: bool, desc: str):
  from tqdm.auto import tqdm
  return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True)


def train(config) -> dict[str, float]:
  """Builds the experiment, resumes when asked, trains, and exports the final policy."""
  exp = build_experiment(config)
  trainer = Trainer(exp)
  if config.train.resume and trainer.try_resume():
    logging.info("resumed from iteration %d", trainer.iteration)
  metrics = trainer.run()
  policy = mesh_lib.fetch(trainer.state.policy)  # a gather every process takes part in
  if trainer.is_main:
    export_dir = os.path.join(config.workdir, "final_model")
    dataclasses.replace(exp.model, params=policy).export(export_dir, exp.tokenizer)
    with open(os.path.join(config.workdir, "final_metrics.json"), "w") as f:
      json.dump(metrics, f, indent=2)
  trainer.checkpointer.close()
  return metrics


def main(config):
  logging.getLogger().setLevel(logging.INFO)
  metrics = train(config)
  if jax.process_index() == 0:
    print(json.dumps({k: round(v, 4) for k, v in metrics.items() if "/" in k and not k.startswith("time")}, indent=1))


if __name__ == "__main__":
  config_lib.run(main)
