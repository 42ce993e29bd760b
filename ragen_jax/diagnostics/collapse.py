"""Collapse diagnostics inside the jitted update: MI proxies, token entropies, gradient buckets.

`make_diagnostics_fn` builds the `diagnostics_fn` (a hashable `MIDiagnostics`) that `rl.update`
calls on the pre-update policy, before filtering. Every `compute_freq` calls it
cross-scores sampled (prompt, reasoning) pairs (see `cross_scoring`) for each
sampling variant and logs SPEC §5's family under `collapse/<variant>/…`
(`_seq` suffix: summed log-probs); in between, a `lax.cond` skips the scoring
and logs zeros with `collapse/computed` = 0. The z-score EMAs live in the
diagnostics state (`init_diagnostics_state`), which the trainer checkpoints.

`make_grad_analysis_fn` (`GradAnalysis`) is the (switchable) SPEC §6 gradient analysis: per
reward-variance bucket, the gradient norms of the task, entropy and KL terms.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ragen_jax import mesh as mesh_lib
from ragen_jax.config import check, check_one_of
from ragen_jax.diagnostics import cross_scoring as xs
from ragen_jax.diagnostics.grad_buckets import (BUCKET_MODES, assign_buckets, bucket_episode_masks,
                                                bucket_grad_norms, bucket_ranges)
from ragen_jax.diagnostics.mi import MARGINAL_CONVENTIONS, ZscoreEMA, apply_zscore_emas, mi_metrics_from_scores
from ragen_jax.models import lora
from ragen_jax.models.config import ModelConfig
from ragen_jax.rl import snr_filter
from ragen_jax.rl.losses import PolicyLossConfig, actor_loss
from ragen_jax.scoring import masked_mean, token_logp_and_entropy
from ragen_jax.trajectories import Trajectories

VARIANTS = ("first_turn", "trajectory")


@dataclasses.dataclass(frozen=True)
class CollapseConfig:
  """The `diagnostics` config section: the collapse diagnostics (static under jit) and the alarm.

  num_samples: R, reasoning rows per variant (first-turn: at most the batch size).
  max_reasoning_tokens: reasonings are scored on their first this-many tokens (the trainer caps it at the
    rollout's `max_new_tokens`).
  max_prompt_tokens: static prompt window (0: the batch's sequence length); turns
    whose prompt is longer are not sampled (first-turn columns are cut and counted in
    `collapse/first_turn/columns_cut`).
  block_tokens, columns_per_step, rows_per_step: scorer work split (see
    `cross_scoring.cross_logp`; rows_per_step 0: all rows at once); they trade memory for speed, not results.
  bucket_edges: the `fixed` bucket mode's edges (empty: 0, 1, …, num_buckets − 1).
  grad_analysis: run `make_grad_analysis_fn`'s analysis (every `compute_freq` steps).
  alarm_*: the template-collapse alarm over the logged MI z-score (see `diagnostics.alarm`).
  """

  enabled: bool = True
  compute_freq: int = 1  # reference: 5
  num_samples: int = 64
  variants: tuple[str, ...] = VARIANTS
  marginal: str = "paper"
  ema_decay: float = 0.9
  max_reasoning_tokens: int = 256
  max_prompt_tokens: int = 0
  block_tokens: int = 16
  columns_per_step: int = 8
  rows_per_step: int = 16
  grad_analysis: bool = False
  num_buckets: int = 6
  bucket_mode: str = "quantile"
  bucket_edges: tuple[float, ...] = ()
  alarm_window: int = 4  # logged points compared (first vs last)
  alarm_drop: float = 0.5  # relative fall of the MI z-score
  alarm_entropy_tolerance: float = 0.3  # relative band the entropy must stay in (see `diagnostics.alarm`)
  alarm_min_drop: float = 0.1  # absolute fall of the MI z-score the alarm also needs

  def __post_init__(self):
    object.__setattr__(self, "variants", tuple(self.variants))  # a ConfigDict may hand over a list
    object.__setattr__(self, "bucket_edges", tuple(self.bucket_edges))
    check("diagnostics.compute_freq", self.compute_freq >= 1, "must be >= 1", self.compute_freq)
    check("diagnostics.num_samples", self.num_samples >= 2, "must be >= 2", self.num_samples)
    check("diagnostics.variants", bool(self.variants) and set(self.variants) <= set(VARIANTS)
          and len(set(self.variants)) == len(self.variants), f"must be distinct names from {VARIANTS}",
          self.variants)
    check_one_of("diagnostics.marginal", self.marginal, MARGINAL_CONVENTIONS)
    check_one_of("diagnostics.bucket_mode", self.bucket_mode, BUCKET_MODES)
    check("diagnostics.ema_decay", 0.0 <= self.ema_decay < 1.0, "must be in [0, 1)", self.ema_decay)
    for name in ("max_reasoning_tokens", "block_tokens", "columns_per_step", "num_buckets"):
      check(f"diagnostics.{name}", getattr(self, name) >= 1, "must be >= 1", getattr(self, name))
    for name in ("max_prompt_tokens", "rows_per_step"):
      check(f"diagnostics.{name}", getattr(self, name) >= 0, "must be >= 0 (0: no limit)", getattr(self, name))
    check("diagnostics.alarm_window", self.alarm_window >= 2, "must cover at least 2 points", self.alarm_window)
    check("diagnostics.alarm_drop", self.alarm_drop > 0, "must be > 0", self.alarm_drop)
    check("diagnostics.alarm_entropy_tolerance", self.alarm_entropy_tolerance >= 0, "must be >= 0",
          self.alarm_entropy_tolerance)
    check("diagnostics.alarm_min_drop", self.alarm_min_drop >= 0, "must be >= 0", self.alarm_min_drop)


def init_diagnostics_state(cfg: CollapseConfig) -> dict:
  """The diagnostics' part of the train state: a step counter and one z-score EMA per
  variant and family (`<variant>` per-token, `<variant>_seq` summed)."""
  emas = {variant + suffix: ZscoreEMA.init() for variant in cfg.variants for suffix in ("", "_seq")}
  return {"step": jnp.zeros((), jnp.int32), "zscore_ema": emas}


def _zeros_like_tree(shapes):
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _every_nth_step(freq: int, step, fn, skip, *args):
  """fn(*args) when `step % freq == 0`, else skip(fn's output shapes, *args); at freq 1, fn alone (no skip
  branch to trace and compile)."""
  if freq == 1:
    return fn(*args)
  shapes = jax.eval_shape(fn, *args)
  return jax.lax.cond(step % freq == 0, fn, lambda *a: skip(shapes, *a), *args)


def _entropy_metrics(batch: Trajectories, entropy_BT: jax.Array) -> dict[str, jax.Array]:
  """Policy token entropy on reasoning tokens (an H(Z|X) estimate) and on whole responses,
  plus the share of turns with valid reasoning."""
  turns_BK = batch.response_start >= 0
  return {
      "collapse/reasoning_token_entropy": masked_mean(entropy_BT, xs.reasoning_token_mask(batch)),
      "collapse/response_token_entropy": masked_mean(entropy_BT, batch.loss_mask),
      "collapse/valid_thinking_rate": jnp.sum(xs.has_reasoning(batch)) / jnp.maximum(jnp.sum(turns_BK), 1),
  }


@dataclasses.dataclass(frozen=True)
class MIDiagnostics:
  """The update's `diagnostics_fn(model_config, policy_params, state, batch, old_logp_BT, entropy_BT, key)
  -> (state, metrics)`, hashable by its settings (two trainers with equal settings share the update's compilation).

  Per variant: the MI family of `mi_metrics_from_scores` with `mi_zscore_ema(_seq)`,
  `num_rows` (real rows), `reasoning_cut` (share of rows longer than
  `max_reasoning_tokens`) and `matched_logp_gap` (mean |S[r, own] − the rollout's
  summed log-prob of the same tokens|: 0 up to rounding, a check that the scorer and
  the learner see the same policy).
  """

  cfg: CollapseConfig
  num_groups: int
  group_size: int

  def __post_init__(self):
    if "first_turn" in self.cfg.variants and self.num_groups < 2:
      raise ValueError(f"first-turn cross-scoring needs at least 2 groups (columns), got {self.num_groups}")

  def _variant_metrics(self, model_config, policy_params, batch, old_logp_BT, variant, key):
    cfg = self.cfg
    window = cfg.max_prompt_tokens or batch.seq_len
    if variant == "first_turn":
      rows = min(cfg.num_samples, self.num_groups * self.group_size)
      pairs = xs.first_turn_pairs(batch, self.num_groups, rows, key, window)
    else:
      pairs = xs.trajectory_pairs(batch, cfg.num_samples, key, window)
    sum_logp_RN, length_R = xs.score_pairs(
        model_config, policy_params, batch, pairs, max_reasoning_tokens=cfg.max_reasoning_tokens,
        prompt_window=window, block_tokens=cfg.block_tokens, columns_per_step=cfg.columns_per_step,
        rows_per_step=cfg.rows_per_step)
    metrics = mi_metrics_from_scores(sum_logp_RN, length_R, pairs.own_col, xs.prompt_equivalence(batch, pairs),
                                     pairs.row_mask, marginal=cfg.marginal)
    rollout_logp_RZ, _ = xs.gather_reasoning(old_logp_BT, batch, pairs.row_episode, pairs.row_turn,
                                             cfg.max_reasoning_tokens)
    own_R = jnp.take_along_axis(sum_logp_RN, pairs.own_col[:, None], axis=1)[:, 0]
    full_length_R = batch.reasoning_len[pairs.row_episode, pairs.row_turn]
    prompt_length_N = batch.response_start[pairs.col_episode, pairs.col_turn]
    metrics |= {
        "num_rows": jnp.sum(pairs.row_mask).astype(jnp.float32),
        "reasoning_cut": masked_mean((full_length_R > cfg.max_reasoning_tokens).astype(jnp.float32), pairs.row_mask),
        "matched_logp_gap": masked_mean(jnp.abs(own_R - jnp.sum(rollout_logp_RZ, axis=1)), pairs.row_mask),
    }
    if variant == "first_turn":
      metrics["columns_cut"] = jnp.sum(prompt_length_N > window).astype(jnp.float32)
    return metrics, jnp.any(pairs.row_mask)

  def _compute(self, model_config, policy_params, emas, batch, old_logp_BT, key):
    emas, metrics = dict(emas), {"collapse/computed": jnp.ones((), jnp.float32)}
    for variant, variant_key in zip(self.cfg.variants, jax.random.split(key, len(self.cfg.variants))):
      family, has_rows = self._variant_metrics(model_config, policy_params, batch, old_logp_BT, variant, variant_key)
      updated, family = apply_zscore_emas(emas, variant, family, self.cfg.ema_decay)
      # A matrix without rows says nothing about the marginal's spread: keep the EMA.
      emas = jax.tree.map(lambda new, old: jnp.where(has_rows, new, old), updated, emas)
      metrics |= {f"collapse/{variant}/{name}": value for name, value in family.items()}
    return emas, metrics

  def __call__(self, model_config: ModelConfig, policy_params, state, batch: Trajectories, old_logp_BT, entropy_BT,
               key):
    if batch.batch_size != self.num_groups * self.group_size:
      raise ValueError(f"batch has {batch.batch_size} episodes, diagnostics expect {self.num_groups} × "
                       f"{self.group_size}")
    emas = state["zscore_ema"]
    args = (policy_params, emas, batch, old_logp_BT, key)
    compute = functools.partial(self._compute, model_config)
    emas, metrics = _every_nth_step(self.cfg.compute_freq, state["step"], compute,
                                    lambda shapes, _, emas, *rest: (emas, _zeros_like_tree(shapes[1])), *args)
    new_state = {"step": state["step"] + 1, "zscore_ema": emas}
    return new_state, _entropy_metrics(batch, entropy_BT) | metrics



def make_diagnostics_fn(cfg: CollapseConfig, num_groups: int, group_size: int) -> MIDiagnostics | None:
  """The update's `diagnostics_fn` (`MIDiagnostics`), None when `cfg.enabled` is False."""
  return MIDiagnostics(cfg, num_groups, group_size) if cfg.enabled else None


def without_skipped(metrics: dict, cfg: CollapseConfig) -> dict:
  """Host-side `metrics` without the zeros that stand in for the diagnostics `compute_freq` skipped this
  step (`collapse/computed` or `grad_analysis/computed` is 0), so logs and plots hold measurements only."""
  skipped = []
  if not metrics.get("collapse/computed", 1.0):
    skipped += [f"collapse/{variant}/" for variant in cfg.variants]
  if not metrics.get("grad_analysis/computed", 1.0):
    skipped.append("grad_analysis/bucket_")
  return {k: v for k, v in metrics.items() if not k.startswith(tuple(skipped))}


@dataclasses.dataclass(frozen=True)
class GradAnalysis:
  """The update's `grad_analysis_fn(model_config, policy_params, batch, old_logp_BT, advantages_BT, loss_mask_BT,
  ref_logp_BT, scores_G, step, base=None) -> metrics`, hashable by its settings. Gradients are taken with respect to
  `policy_params`, the trained params (with LoRA, the adapters over the frozen `base`).

  Groups with any token in `loss_mask_BT` are split into `cfg.num_buckets` buckets by
  `scores_G` (the filter score: reward variance or std); per bucket k the actor loss
  is rebuilt on that bucket's episodes alone (the aggregation of `loss_cfg.agg` over
  them) and `grad_analysis/bucket_k/{task,entropy,kl}_grad_norm` are the global
  norms of ∇pg_loss, ∇(entropy_coef·entropy) and ∇(kl_coef·kl) (kl only with
  `use_kl_loss`), next to the bucket's `reward_std_min/max` and `num_groups`
  (empty bucket: norms 0, range NaN). Runs when `step % compute_freq == 0`
  (`grad_analysis/computed`); costs about one forward and three backward passes
  over the batch, done `micro_batch_size` episodes at a time (or as many more as spread over the mesh's batch
  shards: `mesh.rows_per_step`).
  """

  cfg: CollapseConfig
  loss_cfg: PolicyLossConfig
  num_groups: int
  micro_batch_size: int

  def _loss_terms(self, model_config, params, batch, old_logp_BT, advantages_BT, loss_mask_BT, ref_logp_BT,
                  episode_mask_B):
    loss_cfg, micro_batch_size = self.loss_cfg, self.micro_batch_size
    # Bucket members first, so micro-batches without any are skipped (forward and backward).
    order_B = jnp.argsort(~episode_mask_B, stable=True)
    member_B = episode_mask_B[order_B]
    rows = mesh_lib.rows_per_step(micro_batch_size, episode_mask_B.shape[0])
    micro = lambda x: mesh_lib.split_rows(x, rows)  # noqa: E731
    forward = jax.checkpoint(lambda p, *inputs: token_logp_and_entropy(model_config, p, *inputs))

    def micro_forward(chunk):
      *inputs, member = chunk
      zeros = jnp.zeros(inputs[0].shape, jnp.float32)
      return jax.lax.cond(jnp.any(member), forward, lambda *_: (zeros, zeros), params, *inputs)

    inputs = (batch.tokens, batch.valid, batch.segment_ids, batch.visible_from)
    logp, entropy = jax.lax.map(micro_forward, tuple(micro(x[order_B]) for x in inputs) + (micro(member_B),))
    logp, entropy = logp.reshape(loss_mask_BT.shape), entropy.reshape(loss_mask_BT.shape)
    ref = None if ref_logp_BT is None else ref_logp_BT[order_B]
    _, aux = actor_loss(logp, old_logp_BT[order_B], advantages_BT[order_B],
                        loss_mask_BT[order_B] & member_B[:, None], entropy, ref, loss_cfg)
    terms = {"task": aux["pg_loss"], "entropy": loss_cfg.entropy_coef * aux["entropy"]}
    if loss_cfg.use_kl_loss:
      terms["kl"] = loss_cfg.kl_coef * aux["kl_loss"]
    return terms

  def _analyse(self, model_config, base, policy_params, batch, old_logp_BT, advantages_BT, loss_mask_BT, ref_logp_BT,
               scores_G):
    cfg, num_groups = self.cfg, self.num_groups
    group_has_tokens_G = jax.ops.segment_max(jnp.any(loss_mask_BT, axis=1).astype(jnp.int32), batch.group_ids,
                                             num_segments=num_groups) > 0
    bucket_G = assign_buckets(scores_G, num_buckets=cfg.num_buckets, mode=cfg.bucket_mode,
                              edges=cfg.bucket_edges or None, group_mask=group_has_tokens_G)
    masks_KB = bucket_episode_masks(bucket_G, batch.group_ids, cfg.num_buckets)
    norms = bucket_grad_norms(
        lambda p, m: self._loss_terms(model_config, lora.combine(base, p), batch, old_logp_BT, advantages_BT,
                                      loss_mask_BT, ref_logp_BT, m),
        policy_params, masks_KB)
    reward_std_G = snr_filter.group_scores(batch.score, batch.group_ids, num_groups, metric="std")
    low_K, high_K, count_K = bucket_ranges(reward_std_G, bucket_G, cfg.num_buckets)
    metrics = {"grad_analysis/computed": jnp.ones((), jnp.float32)}
    for k in range(cfg.num_buckets):
      prefix = f"grad_analysis/bucket_{k}/"
      metrics |= {prefix + f"{term}_grad_norm": norm_K[k] for term, norm_K in norms.items()}
      metrics |= {prefix + "reward_std_min": low_K[k], prefix + "reward_std_max": high_K[k],
                  prefix + "num_groups": count_K[k].astype(jnp.float32)}
    return metrics

  def __call__(self, model_config: ModelConfig, policy_params, batch: Trajectories, old_logp_BT, advantages_BT,
               loss_mask_BT, ref_logp_BT, scores_G, step, base=None):
    if batch.batch_size % self.micro_batch_size:
      raise ValueError(f"micro_batch_size {self.micro_batch_size} must divide the batch of {batch.batch_size} "
                       f"episodes")
    if self.loss_cfg.use_kl_loss and ref_logp_BT is None:
      raise ValueError("the KL term's gradient needs ref_logp_BT (use_kl_loss is on)")
    args = (policy_params, batch, old_logp_BT, advantages_BT, loss_mask_BT, ref_logp_BT, scores_G)
    analyse = functools.partial(self._analyse, model_config, base)
    return _every_nth_step(self.cfg.compute_freq, step, analyse, lambda shapes, *_: _zeros_like_tree(shapes), *args)


def make_grad_analysis_fn(cfg: CollapseConfig, loss_cfg: PolicyLossConfig, num_groups: int,
                          micro_batch_size: int) -> GradAnalysis | None:
  """The update's `grad_analysis_fn` (`GradAnalysis`), None when `cfg.grad_analysis` is False."""
  return GradAnalysis(cfg, loss_cfg, num_groups, micro_batch_size) if cfg.grad_analysis else None
