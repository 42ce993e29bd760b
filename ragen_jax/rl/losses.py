"""Actor and critic losses of the StarPO family (verl semantics), on [B, T] tokens.

Every loss is aggregated over `mask_BT` (assistant tokens) with one of three
modes; sequences with an empty mask (e.g. groups removed by the SNR filter)
take no part in sequence means, and an all-empty batch gives loss 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ragen_jax.scoring import masked_mean, masked_sum

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_ESTIMATORS = ("kl", "low_var_kl", "mse")
LOG_RATIO_LIMIT = 20.0  # |log π/π_old| is clamped here before exp (verl)
LOW_VAR_KL_LIMIT = 10.0  # k3 is clipped to [-10, 10] (verl)


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Settings of the actor loss; defaults are SPEC §4 (clip-higher, dual clip, no KL)."""
  clip_low: float = 0.2
  clip_high: float = 0.28
  dual_clip: float | None = 3.0  # c > 1, for negative advantages; None disables
  entropy_coef: float = 0.001
  use_kl_loss: bool = False
  kl_coef: float = 0.001
  kl_estimator: str = "low_var_kl"
  agg: str = "token-mean"

  def __post_init__(self):
    if self.agg not in AGG_MODES:
      raise ValueError(f"agg must be one of {AGG_MODES}, got {self.agg!r}")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
    if self.dual_clip is not None and self.dual_clip <= 1.0:
      raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
    if not (0.0 <= self.clip_low < 1.0 and self.clip_high >= 0.0):
      raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")


def aggregate(loss_BT: jax.Array, mask_BT: jax.Array, mode: str = "token-mean") -> jax.Array:
  """Reduces per-token losses to a scalar.

  `token-mean`: mean over all masked tokens. `seq-mean-token-mean`: mean over
  sequences of each sequence's token mean. `seq-mean-token-sum`: mean over
  sequences of each sequence's token sum. Sequence means skip empty sequences.
  """
  if mode not in AGG_MODES:
    raise ValueError(f"aggregation mode must be one of {AGG_MODES}, got {mode!r}")
  if mode == "token-mean":
    return masked_mean(loss_BT, mask_BT)
  per_seq_B = masked_mean(loss_BT, mask_BT, axis=-1) if mode == "seq-mean-token-mean" \
      else masked_sum(loss_BT, mask_BT, axis=-1)
  return masked_mean(per_seq_B, jnp.any(mask_BT, axis=-1))


def kl_penalty(logp_BT: jax.Array, ref_logp_BT: jax.Array, estimator: str = "low_var_kl") -> jax.Array:
  """Per-token KL(π‖π_ref) estimate from sampled-token log-probs.

  `kl` (k1): logp − ref; `mse` (k2): ½(logp − ref)²; `low_var_kl` (k3):
  exp(ref − logp) − (ref − logp) − 1, clipped to [−10, 10].
  """
  log_ratio_BT = logp_BT - ref_logp_BT
  if estimator == "kl":
    return log_ratio_BT
  if estimator == "mse":
    return 0.5 * jnp.square(log_ratio_BT)
  if estimator == "low_var_kl":
    ref_minus_logp_BT = jnp.clip(-log_ratio_BT, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    k3_BT = jnp.exp(ref_minus_logp_BT) - ref_minus_logp_BT - 1.0
    return jnp.clip(k3_BT, -LOW_VAR_KL_LIMIT, LOW_VAR_KL_LIMIT)
  raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def policy_loss(logp_BT: jax.Array, old_logp_BT: jax.Array, advantages_BT: jax.Array, mask_BT: jax.Array,
                *, clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float | None = 3.0,
                agg: str = "token-mean") -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO clipped-ratio loss with clip-higher and dual clip (verl `compute_policy_loss`).

  ratio r = exp(logp − old_logp); per token
    l = max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high)),
  and for A < 0 additionally l = min(l, −A·dual_clip). Metrics: `pg_clipfrac`
  (the clipped term was active), `pg_clipfrac_low` / `_high` (by side),
  `pg_clipfrac_dual` (dual clip active), `ppo_kl` (mean old_logp − logp),
  `ratio_mean`.
  """
  log_ratio_BT = jnp.clip(logp_BT - old_logp_BT, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
  ratio_BT = jnp.exp(log_ratio_BT)
  unclipped_BT = -advantages_BT * ratio_BT
  clipped_BT = -advantages_BT * jnp.clip(ratio_BT, 1.0 - clip_low, 1.0 + clip_high)
  loss_BT = jnp.maximum(unclipped_BT, clipped_BT)
  negative_BT = advantages_BT < 0
  metrics = {
      "pg_clipfrac": masked_mean((clipped_BT > unclipped_BT).astype(jnp.float32), mask_BT),
      "pg_clipfrac_low": masked_mean((negative_BT & (ratio_BT < 1.0 - clip_low)).astype(jnp.float32), mask_BT),
      "pg_clipfrac_high": masked_mean(((advantages_BT > 0) & (ratio_BT > 1.0 + clip_high)).astype(jnp.float32),
                                      mask_BT),
      "ppo_kl": masked_mean(-log_ratio_BT, mask_BT),
      "ratio_mean": masked_mean(ratio_BT, mask_BT),
  }
  if dual_clip is not None:
    dual_BT = -advantages_BT * dual_clip
    metrics["pg_clipfrac_dual"] = masked_mean((negative_BT & (loss_BT > dual_BT)).astype(jnp.float32), mask_BT)
    loss_BT = jnp.where(negative_BT, jnp.minimum(loss_BT, dual_BT), loss_BT)
  return aggregate(loss_BT, mask_BT, agg), metrics


def actor_loss(logp_BT: jax.Array, old_logp_BT: jax.Array, advantages_BT: jax.Array, mask_BT: jax.Array,
               entropy_BT: jax.Array, ref_logp_BT: jax.Array | None = None,
               cfg: PolicyLossConfig = PolicyLossConfig()) -> tuple[jax.Array, dict[str, jax.Array]]:
  """pg_loss − entropy_coef·entropy (+ kl_coef·KL when `use_kl_loss`).

  Returns (loss, aux); aux holds the terms `pg_loss`, `entropy` and
  `kl_loss` (0 when off) as differentiable scalars, plus policy metrics.
  """
  pg, aux = policy_loss(logp_BT, old_logp_BT, advantages_BT, mask_BT, clip_low=cfg.clip_low,
                        clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, agg=cfg.agg)
  entropy = aggregate(entropy_BT, mask_BT, cfg.agg)
  kl = jnp.zeros((), jnp.float32)
  if cfg.use_kl_loss:
    if ref_logp_BT is None:
      raise ValueError("use_kl_loss needs ref_logp_BT")
    kl = aggregate(kl_penalty(logp_BT, ref_logp_BT, cfg.kl_estimator), mask_BT, cfg.agg)
  loss = pg - cfg.entropy_coef * entropy + (cfg.kl_coef * kl if cfg.use_kl_loss else 0.0)
  return loss, aux | {"pg_loss": pg, "entropy": entropy, "kl_loss": kl}


def value_loss(values_BT: jax.Array, old_values_BT: jax.Array, returns_BT: jax.Array, mask_BT: jax.Array,
               *, clip: float = 0.5, agg: str = "token-mean") -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped critic loss (verl): ½·agg(max((V − G)², (V_clip − G)²)).

  V_clip = clip(V, old_V − clip, old_V + clip), which is V itself inside the range (old_V + clip(V − old_V)
  can differ from V by a rounding step). Metric `vf_clipfrac`: share of tokens where the clipped term was
  larger.
  """
  clipped_BT = jnp.clip(values_BT, old_values_BT - clip, old_values_BT + clip)
  sq_err_BT = jnp.square(values_BT - returns_BT)
  sq_err_clipped_BT = jnp.square(clipped_BT - returns_BT)
  loss = 0.5 * aggregate(jnp.maximum(sq_err_BT, sq_err_clipped_BT), mask_BT, agg)
  return loss, {"vf_clipfrac": masked_mean((sq_err_clipped_BT > sq_err_BT).astype(jnp.float32), mask_BT),
                "vpred_mean": masked_mean(values_BT, mask_BT)}
