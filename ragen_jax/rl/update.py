"""The jitted RL update of one iteration: score → diagnose → learn (filter, advantages, PPO epochs).

The three phases are module-level functions jitted with the model config and an `UpdateConfig` as static
arguments (both hashable by value, the optimizer included), so every trainer of a process with the same
settings shares JAX's own compilations; the trainer calls and times each phase with the state donated.
Everything runs on static shapes: SNR-Aware Filtering produces a group mask, kept episodes are ordered
first, micro-batches with nothing kept are skipped with `lax.cond` (so filtering saves compute without
recompiling), and so is the optimizer step of a mini-batch with nothing kept. An optimizer step whose loss or
gradient norm is not finite is rejected inside the step (`_minibatch_step`): the weights and optimizer state stay
as they were, and `learn` counts it (`rejected_updates`, and `rejected_tail` for the trainer's halting rule).

With LoRA (`ModelConfig.lora`) the train state holds only what is trained, the adapters (and the critic's adapters
and value head), and each phase gets the frozen base weights as `base` (`models.lora.split`); gradients and
optimizer moments exist for the adapters alone, and the KL reference is the base with adapters off.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from ragen_jax import mesh as mesh_lib
from ragen_jax.config import check
from ragen_jax.finite import all_finite
from ragen_jax.models import lora
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.model import param_specs
from ragen_jax.rl import advantages as adv_lib
from ragen_jax.rl import snr_filter
from ragen_jax.rl.losses import actor_loss, value_loss
from ragen_jax.rl.presets import AlgorithmConfig
from ragen_jax.rl.snr_filter import FilterConfig
from ragen_jax.scoring import masked_mean, token_logp_and_entropy, token_values
from ragen_jax.trajectories import Trajectories


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW after global-norm gradient clipping; `make()` builds the optax transformation."""

  lr: float = 1e-6
  beta1: float = 0.9
  beta2: float = 0.999
  weight_decay: float = 0.01
  grad_clip: float = 1.0

  def make(self) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(self.grad_clip),
                       optax.adamw(self.lr, b1=self.beta1, b2=self.beta2, weight_decay=self.weight_decay))


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """Static settings of the update step (a jit static argument: every field is hashable by value).

  `diagnostics_fn(model_config, policy_params, diagnostics_state, batch, old_logp_BT, entropy_BT, key)
  -> (diagnostics_state, metrics)` (optional) runs on the pre-update policy (all its params), before filtering.
  `grad_analysis_fn(model_config, policy_params, batch, old_logp_BT, advantages_BT, loss_mask_BT, ref_logp_BT,
  scores_G, step, base) -> metrics` (optional) gets the trained params and the frozen `base` (None without LoRA),
  and advantages of every group (unfiltered). Both must
  compare equal when their settings do (e.g. frozen dataclasses, see `diagnostics.collapse`).
  """

  algorithm: AlgorithmConfig
  filter: FilterConfig
  num_groups: int
  group_size: int
  mini_batch_size: int = 32
  micro_batch_size: int = 8
  ppo_epochs: int = 1
  policy_optimizer: OptimizerConfig = OptimizerConfig()
  critic_optimizer: OptimizerConfig | None = None  # needed by algorithms with a critic
  diagnostics_fn: Callable | None = None
  grad_analysis_fn: Callable | None = None

  def __post_init__(self):
    batch = self.num_groups * self.group_size
    check("train.mini_batch_size", self.mini_batch_size >= 1 and batch % self.mini_batch_size == 0,
          f"must divide the batch of {batch} episodes (train.env_groups x train.group_size)", self.mini_batch_size)
    check("train.micro_batch_size", self.micro_batch_size >= 1 and self.mini_batch_size % self.micro_batch_size == 0,
          f"must divide train.mini_batch_size={self.mini_batch_size}", self.micro_batch_size)
    check("train.ppo_epochs", self.ppo_epochs >= 1, "must be >= 1", self.ppo_epochs)
    if self.algorithm.use_critic and self.critic_optimizer is None:
      raise ValueError(f"advantage {self.algorithm.advantage!r} needs a critic optimizer")

  @property
  def batch_size(self) -> int:
    return self.num_groups * self.group_size


@flax.struct.dataclass
class TrainState:
  """Everything the update changes (and checkpoints). policy / critic: the trained params (with LoRA, the
  adapters and a value head only); critic / critic_opt are None without a critic; `diagnostics` is the collapse
  diagnostics' state (e.g. z-score EMAs)."""

  step: jax.Array
  policy: dict
  policy_opt: optax.OptState
  critic: dict | None
  critic_opt: optax.OptState | None
  diagnostics: dict
  key: jax.Array


def init_train_state(cfg: UpdateConfig, policy, key, critic=None, diagnostics=None) -> TrainState:
  """Fresh optimizer states for `policy` (and `critic`, with the algorithms that use one)."""
  critic_opt = None if critic is None else cfg.critic_optimizer.make().init(critic)
  return TrainState(step=jnp.zeros((), jnp.int32), policy=policy, policy_opt=cfg.policy_optimizer.make().init(policy),
                    critic=critic, critic_opt=critic_opt, diagnostics=diagnostics or {}, key=key)


def _micro_map(fn, micro: int, *arrays):
  """Applies fn (row by row independent) to consecutive micro-batches of the leading axis, as many of them at a
  time as spread over the mesh's batch shards (`mesh.rows_per_step`), and concatenates."""
  batch = arrays[0].shape[0]
  rows = mesh_lib.rows_per_step(micro, batch)
  out = jax.lax.map(lambda xs: fn(*xs), tuple(mesh_lib.split_rows(a, rows) for a in arrays))
  return jax.tree.map(lambda y: y.reshape(batch, *y.shape[2:]), out)


def micro_batch_weights(mask_MbT: jax.Array, agg: str, scope: str) -> tuple[jax.Array, jax.Array]:
  """(actor_M, value_M): the weight of each micro-batch's aggregated actor loss (mode `agg`) and critic loss
  (token-mean) in its mini-batch's loss, float32[M], for the loss masks of M micro-batches of b episodes.

  `mini_batch` (`algorithm.loss_agg_scope`): a micro-batch's share of the mini-batch's masked tokens (token
  means) or non-empty sequences (sequence means), so the weighted sum is the aggregate over the whole
  mini-batch, each token or sequence weighted once (the paper's formulas). `micro_batch`: 1/n for each of the
  n micro-batches holding kept tokens, so the sum is the mean of the per-micro-batch aggregates (the reference:
  verl divides each micro-batch's loss by the number of micro-batches). The reference drops filtered groups
  before it batches, so each of its micro-batches holds kept episodes; here the filtered episodes are ordered
  last, and their micro-batches, which the reference does not have, weigh 0 and do not count in n.
  """
  tokens_M = jnp.sum(mask_MbT, axis=(1, 2)).astype(jnp.float32)
  if scope == "micro_batch":
    active_M = (tokens_M > 0).astype(jnp.float32)
    weights_M = active_M / jnp.maximum(jnp.sum(active_M), 1.0)
    return weights_M, weights_M
  actor_M = tokens_M if agg == "token-mean" else jnp.sum(jnp.any(mask_MbT, axis=2), axis=1).astype(jnp.float32)
  return actor_M / jnp.maximum(jnp.sum(actor_M), 1.0), tokens_M / jnp.maximum(jnp.sum(tokens_M), 1.0)


def in_layout(model_config: ModelConfig, cfg: UpdateConfig, state: TrainState) -> TrainState:
  """`state` constrained to the layout the trainer places it in (under the mesh in context): the policy, the
  critic and their optimizer moments as the logical partition rules say, everything else replicated. Without
  it the compiler picks the phases' output layouts, and a donated state could come back sharded otherwise."""
  if jax.sharding.get_abstract_mesh().empty:
    return state
  constrain = jax.lax.with_sharding_constraint
  replicate = lambda x: constrain(x, PartitionSpec())  # noqa: E731

  def params_and_moments(params, opt_state, optimizer: OptimizerConfig, with_value_head: bool):
    specs = lora.split(model_config, param_specs(model_config, with_value_head))[1]
    return (jax.tree.map(constrain, params, specs),
            optax.tree_map_params(optimizer.make(), constrain, opt_state, specs, transform_non_params=replicate))

  policy, policy_opt = params_and_moments(state.policy, state.policy_opt, cfg.policy_optimizer, False)
  state = state.replace(policy=policy, policy_opt=policy_opt, step=replicate(state.step), key=replicate(state.key),
                        diagnostics=jax.tree.map(replicate, state.diagnostics))
  if state.critic is None:
    return state
  critic, critic_opt = params_and_moments(state.critic, state.critic_opt, cfg.critic_optimizer, True)
  return state.replace(critic=critic, critic_opt=critic_opt)


def _advantages(cfg: UpdateConfig, batch: Trajectories, values, train_mask):
  algo = cfg.algorithm
  if algo.advantage == "gae" and algo.bi_level_gae:
    return adv_lib.bi_level_gae(batch.token_rewards, values, train_mask, batch.turn_end, gamma=algo.gamma,
                                lam=algo.lam, turn_gamma=algo.turn_gamma)
  if algo.advantage == "gae":
    return adv_lib.gae(batch.score_rewards, values, train_mask, gamma=algo.gamma, lam=algo.lam)
  kept = jnp.any(train_mask, axis=1)
  return adv_lib.grpo(batch.score, batch.group_ids, cfg.num_groups, train_mask,
                      norm_by_std=algo.advantage == "grpo", valid_B=kept)


def _group_scores(cfg: UpdateConfig, batch: Trajectories):
  return snr_filter.group_scores(batch.score, batch.group_ids, cfg.num_groups, metric=cfg.filter.metric,
                                 ddof=cfg.filter.ddof)


@functools.partial(jax.jit, static_argnames=("model_config", "cfg"))
def score(model_config: ModelConfig, cfg: UpdateConfig, state: TrainState, ref_params, batch: Trajectories,
          base=None) -> dict:
  """Per-token log-probs and entropy of the batch under the pre-update policy (and the reference model /
  critic when the algorithm uses them): {"old_logp", "entropy"[, "ref_logp"][, "values"]}, float32[B, T].
  `ref_params` are scored without adapters; `base`: the frozen weights under LoRA adapters (None without)."""
  micro = cfg.micro_batch_size
  inputs = (batch.tokens, batch.valid, batch.segment_ids, batch.visible_from)
  policy = lora.combine(base, state.policy)
  old_logp, entropy = _micro_map(lambda *x: token_logp_and_entropy(model_config, policy, *x), micro, *inputs)
  scores = {"old_logp": old_logp, "entropy": entropy}
  if cfg.algorithm.use_kl_loss:
    ref_config = lora.without(model_config)
    scores["ref_logp"] = _micro_map(lambda *x: token_logp_and_entropy(ref_config, ref_params, *x)[0], micro, *inputs)
  if cfg.algorithm.use_critic:
    critic = lora.combine(base, state.critic)
    scores["values"] = _micro_map(lambda *x: token_values(model_config, critic, *x), micro, *inputs)
  return scores


@functools.partial(jax.jit, static_argnames=("model_config", "cfg"), donate_argnames=("state",))
def diagnose(model_config: ModelConfig, cfg: UpdateConfig, state: TrainState, batch: Trajectories, scores: dict,
             base=None):
  """Collapse diagnostics and gradient analysis on the pre-update policy (all groups): (state, metrics)."""
  metrics = {}
  if cfg.diagnostics_fn is not None:
    key, diag_key = jax.random.split(state.key)
    diag_state, metrics = cfg.diagnostics_fn(model_config, lora.combine(base, state.policy), state.diagnostics, batch,
                                             scores["old_logp"], scores["entropy"], diag_key)
    state = state.replace(diagnostics=diag_state, key=key)
  if cfg.grad_analysis_fn is not None:
    all_adv, _ = _advantages(cfg, batch, scores.get("values"), batch.loss_mask)
    metrics |= cfg.grad_analysis_fn(model_config, state.policy, batch, scores["old_logp"], all_adv, batch.loss_mask,
                                    scores.get("ref_logp"), _group_scores(cfg, batch), state.step, base)
  return in_layout(model_config, cfg, state), metrics


def _micro_loss(model_config: ModelConfig, cfg: UpdateConfig, base, params, critic, mb, weight, v_weight):
  """One micro-batch's losses, weighted (`micro_batch_weights`) as its part of the mini-batch's loss; `params` and
  `critic` are the trained parts over the frozen `base` (None without LoRA)."""
  inputs = (mb["tokens"], mb["valid"], mb["segment_ids"], mb["visible_from"])
  logp, entropy = token_logp_and_entropy(model_config, lora.combine(base, params), *inputs)
  loss, aux = actor_loss(logp, mb["old_logp"], mb["adv"], mb["mask"], entropy, mb.get("ref_logp"),
                         cfg.algorithm.loss)
  total = weight * loss
  metrics = {k: weight * v for k, v in aux.items()}
  if cfg.algorithm.use_critic:
    values = token_values(model_config, lora.combine(base, critic), *inputs)
    v_loss, v_aux = value_loss(values, mb["old_values"], mb["returns"], mb["mask"], clip=cfg.algorithm.value_clip,
                               agg="token-mean")
    total = total + v_weight * v_loss
    metrics |= {"value_loss": v_weight * v_loss} | {k: v_weight * v for k, v in v_aux.items()}
  return total, metrics


def _minibatch_step(model_config: ModelConfig, cfg: UpdateConfig, state: TrainState, base, mini):
  """One optimizer step on a mini-batch: (state, metrics).

  A mini-batch with nothing kept leaves the weights and optimizer alone (`stepped` 0). So does a rejected step
  (`rejected` 1): one whose loss or gradient norm is not finite, or whose update would make a weight or an
  optimizer moment non-finite; the decision is made here, inside the jitted step, so a non-finite update is never
  applied. Both count as no update (`applied` 0).
  """
  micro, use_critic = cfg.micro_batch_size, cfg.algorithm.use_critic
  micro_loss = functools.partial(_micro_loss, model_config, cfg, base)
  grad_fn = jax.value_and_grad(micro_loss, argnums=(0, 1), has_aux=True)
  split = jax.tree.map(lambda x: x.reshape(-1, micro, *x.shape[1:]), mini)
  weights = micro_batch_weights(split["mask"], cfg.algorithm.loss.agg, cfg.algorithm.loss_agg_scope)
  zero_grads = (jax.tree.map(jnp.zeros_like, state.policy), jax.tree.map(jnp.zeros_like, state.critic))
  _, zero_metrics = jax.eval_shape(lambda: micro_loss(state.policy, state.critic, jax.tree.map(lambda x: x[0], split),
                                                      *(w[0] for w in weights)))
  zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_metrics)
  zero = ((jnp.zeros((), jnp.float32), zero_metrics), zero_grads)

  def accumulate(acc, xs):
    mb, weight, v_weight = xs
    new = jax.lax.cond(jnp.any(mb["mask"]), lambda: grad_fn(state.policy, state.critic, mb, weight, v_weight),
                       lambda: zero)
    return jax.tree.map(jnp.add, acc, new), None

  ((loss, metrics), (policy_grads, critic_grads)), _ = jax.lax.scan(accumulate, zero, (split, *weights))

  def apply(state):
    updates, policy_opt = cfg.policy_optimizer.make().update(policy_grads, state.policy_opt, state.policy)
    new = state.replace(policy=optax.apply_updates(state.policy, updates), policy_opt=policy_opt)
    if use_critic:
      c_updates, critic_opt = cfg.critic_optimizer.make().update(critic_grads, state.critic_opt, state.critic)
      new = new.replace(critic=optax.apply_updates(state.critic, c_updates), critic_opt=critic_opt)
    finite = all_finite((new.policy, new.policy_opt, new.critic, new.critic_opt))
    return jax.tree.map(functools.partial(jnp.where, finite), new, state), finite

  stepped = jnp.any(mini["mask"])  # a mini-batch with nothing kept is no step
  metrics["grad_norm"] = optax.global_norm(policy_grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(metrics["grad_norm"])
  if use_critic:
    metrics["critic_grad_norm"] = optax.global_norm(critic_grads)
    finite &= jnp.isfinite(metrics["critic_grad_norm"])
  state, applied = jax.lax.cond(stepped & finite, apply, lambda s: (s, jnp.array(False)), state)
  metrics |= {"stepped": stepped.astype(jnp.float32), "applied": applied.astype(jnp.float32),
              "rejected": (stepped & ~applied).astype(jnp.float32)}
  return state, metrics


def rejected_tail(applied_S: jax.Array, rejected_S: jax.Array) -> jax.Array:
  """int32[]: the rejected steps after the last applied one, of S optimizer steps in order (all of them when none
  was applied; steps with nothing kept count as neither)."""
  step = jnp.arange(applied_S.shape[0])
  last_applied = jnp.max(jnp.where(applied_S > 0, step, -1))
  return jnp.sum((rejected_S > 0) & (step > last_applied)).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("model_config", "cfg"), donate_argnames=("state",))
def learn(model_config: ModelConfig, cfg: UpdateConfig, state: TrainState, batch: Trajectories, scores: dict,
          base=None):
  """SNR-Aware Filtering, advantages and the PPO epochs: (state, metrics); `base`: the frozen weights under LoRA
  adapters (None without LoRA)."""
  old_logp, values, ref_logp = scores["old_logp"], scores.get("values"), scores.get("ref_logp")
  metrics = {"policy_entropy": masked_mean(scores["entropy"], batch.loss_mask)}
  scores_G = _group_scores(cfg, batch)
  if cfg.filter.enabled:
    keep_G = snr_filter.select_groups(scores_G, strategy=cfg.filter.strategy, value=cfg.filter.value,
                                      filter_type=cfg.filter.filter_type, prob_mode=cfg.filter.prob_mode,
                                      include_zero=cfg.filter.include_zero, selection_eps=cfg.filter.selection_eps)
  else:
    keep_G = jnp.ones((cfg.num_groups,), bool)
  metrics |= snr_filter.filter_metrics(batch.score, keep_G, scores_G, batch.group_ids, cfg.num_groups)
  kept_B = snr_filter.episode_mask(keep_G, batch.group_ids)
  train_mask = batch.loss_mask & kept_B[:, None]
  adv, returns = _advantages(cfg, batch, values, train_mask)
  adv = adv * snr_filter.loss_scale(keep_G, cfg.filter.loss_scaling)  # the policy-gradient term only

  per_episode = {"tokens": batch.tokens, "valid": batch.valid, "segment_ids": batch.segment_ids,
                 "visible_from": batch.visible_from, "mask": train_mask, "old_logp": old_logp, "adv": adv}
  if ref_logp is not None:
    per_episode["ref_logp"] = ref_logp
  if cfg.algorithm.use_critic:
    per_episode |= {"old_values": values, "returns": returns}

  def epoch(state, _):
    key, shuffle_key = jax.random.split(state.key)
    order = jnp.argsort(jnp.where(kept_B, 0.0, 2.0) + jax.random.uniform(shuffle_key, kept_B.shape))
    minis = jax.tree.map(lambda x: x[order].reshape(-1, cfg.mini_batch_size, *x.shape[1:]), per_episode)
    return jax.lax.scan(lambda s, mini: _minibatch_step(model_config, cfg, s, base, mini), state.replace(key=key),
                        minis)

  # with nothing kept, every mini-batch step is skipped (no cond around the epochs: one trace of the model)
  state, epoch_metrics = jax.lax.scan(epoch, state, None, length=cfg.ppo_epochs)
  stepped, applied, rejected = (epoch_metrics.pop(k).reshape(-1) for k in ("stepped", "applied", "rejected"))
  # the losses average over the steps taken, rejected ones included: a non-finite loss shows as such
  metrics |= jax.tree.map(lambda x: jnp.sum(x) / jnp.maximum(jnp.sum(stepped), 1.0), epoch_metrics)
  metrics |= {"num_updates": jnp.sum(applied), "rejected_updates": jnp.sum(rejected),
              "rejected_tail": rejected_tail(applied, rejected)}
  metrics |= {"advantage_mean": masked_mean(adv, train_mask), "response_length": jnp.mean(
      jnp.sum(batch.loss_mask, axis=1).astype(jnp.float32))}
  return in_layout(model_config, cfg, state.replace(step=state.step + 1)), metrics


def update(model_config: ModelConfig, cfg: UpdateConfig, state: TrainState, ref_params, batch: Trajectories,
           base=None):
  """The three phases in a row: (state, metrics)."""
  scores = score(model_config, cfg, state, ref_params, batch, base)
  state, diag_metrics = diagnose(model_config, cfg, state, batch, scores, base)
  state, metrics = learn(model_config, cfg, state, batch, scores, base)
  return state, diag_metrics | metrics
