"""SNR-Aware Filtering: keep only prompt groups whose reward spread is high.

All selection is a fixed-shape bool mask over groups, so a jitted caller never
recompiles when the kept count changes. The rule follows RAGEN's
`RolloutFilter._select_top_groups` (SPEC §6); the settings (`strategy`,
`value`, `filter_type`, `prob_mode`, `include_zero`) are static Python values,
only the scores are traced.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ragen_jax.config import check, check_one_of
from ragen_jax.rl.groups import flatten_groups, group_stats

STRATEGIES = ("top_p", "top_k", "top_k_abs", "min_p")
FILTER_TYPES = ("largest", "smallest")
PROB_MODES = ("linear", "softmax")
SCORE_METRICS = ("variance", "std")
LOSS_SCALINGS = ("none", "linear", "sqrt")
ZERO_SCORE_EPS = 1e-10  # |score| at or below this counts as a zero-variance group


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  """The `filter` config section: SNR-Aware Filtering settings (SPEC §6); see `select_groups`."""

  enabled: bool = True
  metric: str = "variance"  # paper; the reference code uses "std"
  ddof: int = 1
  strategy: str = "top_p"
  value: float = 0.9
  filter_type: str = "largest"
  prob_mode: str = "linear"
  include_zero: bool = True
  selection_eps: float = 0.01
  loss_scaling: str = "none"

  def __post_init__(self):
    check_one_of("filter.metric", self.metric, SCORE_METRICS)
    check_one_of("filter.strategy", self.strategy, STRATEGIES)
    check_one_of("filter.filter_type", self.filter_type, FILTER_TYPES)
    check_one_of("filter.prob_mode", self.prob_mode, PROB_MODES)
    check_one_of("filter.loss_scaling", self.loss_scaling, LOSS_SCALINGS)
    check("filter.value", self.value > 0, "must be positive", self.value)
    check("filter.ddof", self.ddof >= 0, "must be >= 0", self.ddof)


def _as_flat(rewards, group_ids, num_groups):
  """Accepts rewards[G, S] (group ids implied) or rewards[B] with group_ids[B]."""
  if group_ids is None:
    if rewards.ndim != 2:
      raise ValueError(f"rewards without group_ids must be [G, S], got shape {rewards.shape}")
    num_groups = rewards.shape[0]
    rewards, group_ids = flatten_groups(rewards)
  elif num_groups is None:
    raise ValueError("num_groups (static int) is required with group_ids")
  return rewards, group_ids, num_groups


def group_scores(rewards: jax.Array, group_ids: jax.Array | None = None, num_groups: int | None = None,
                 valid: jax.Array | None = None, *, metric: str = "variance", ddof: int = 1) -> jax.Array:
  """Filter score per group: reward variance (paper) or std (reference code).

  `rewards` is either float[G, S] or float[B] with int `group_ids[B]` and a
  static `num_groups`; `valid` (bool, same shape as rewards) masks padding.
  Returns float32[G].
  """
  if metric not in SCORE_METRICS:
    raise ValueError(f"metric must be one of {SCORE_METRICS}, got {metric!r}")
  valid_flat = None if valid is None else valid.reshape(-1)
  rewards, group_ids, num_groups = _as_flat(rewards, group_ids, num_groups)
  stats = group_stats(rewards, group_ids, num_groups, valid_flat, ddof=ddof)
  return stats.var if metric == "variance" else stats.std


def _order(keys_G: jax.Array, eligible_G: jax.Array, descending: bool) -> jax.Array:
  """Stable sort order of eligible groups by key; ineligible groups go last."""
  sort_key = jnp.where(eligible_G, -keys_G if descending else keys_G, jnp.inf)
  return jnp.argsort(sort_key, stable=True)


def _first_n(order_G: jax.Array, n: jax.Array) -> jax.Array:
  """bool[G] marking the groups at the first `n` positions of `order_G`."""
  num_groups = order_G.shape[0]
  return jnp.zeros(num_groups, bool).at[order_G].set(jnp.arange(num_groups) < n)


def _linear_top_p(scores_G, eligible_G, value, descending, selection_eps):
  """Smallest prefix (in sorted order) whose score sum reaches ρ·Σ − eps.

  Walks the sorted groups, adding each while the running sum is still below
  the threshold; a score ≤ 0 (or an ineligible group) ends the walk. If the
  walk ends below the threshold nothing is kept.
  """
  order_G = _order(scores_G, eligible_G, descending)
  sorted_G = scores_G[order_G]
  threshold = value * jnp.sum(jnp.where(eligible_G, scores_G, 0.0)) - selection_eps
  sum_before_G = jnp.concatenate([jnp.zeros(1, sorted_G.dtype), jnp.cumsum(sorted_G)[:-1]])
  can_take_G = (sum_before_G < threshold) & (sorted_G > 0) & eligible_G[order_G]
  taken_G = jnp.cumprod(can_take_G.astype(jnp.int32)).astype(bool)
  reached = jnp.sum(jnp.where(taken_G, sorted_G, 0.0)) >= threshold
  return _first_n(order_G, jnp.where(reached, jnp.sum(taken_G), 0))


def _softmax_top_p(scores_G, eligible_G, value, descending):
  """Nucleus over p = softmax(±score): k = searchsorted(cumsum p, ρ) + 1."""
  logits_G = scores_G if descending else -scores_G
  probs_G = jax.nn.softmax(jnp.where(eligible_G, logits_G, jnp.finfo(logits_G.dtype).min))
  order_G = _order(logits_G, eligible_G, descending=True)  # softmax is monotone; sorting logits keeps exact ties
  below_G = jnp.cumsum(probs_G[order_G]) < value
  return _first_n(order_G, jnp.minimum(jnp.sum(below_G) + 1, jnp.sum(eligible_G)))


def _top_k(scores_G, eligible_G, k, descending):
  """Keeps max(1, min(k, #eligible)) groups; none if nothing is eligible."""
  num_eligible = jnp.sum(eligible_G)
  n = jnp.where(num_eligible > 0, jnp.maximum(jnp.minimum(k, num_eligible), 1), 0)
  return _first_n(_order(scores_G, eligible_G, descending), n)


def _min_p(scores_G, eligible_G, value, descending):
  """Keeps score ≥ ρ·max (largest) or score ≤ min/ρ (smallest)."""
  if descending:
    cutoff = value * jnp.max(jnp.where(eligible_G, scores_G, -jnp.inf))
    return eligible_G & (scores_G >= cutoff - ZERO_SCORE_EPS)
  cutoff = jnp.min(jnp.where(eligible_G, scores_G, jnp.inf)) / (value + ZERO_SCORE_EPS)
  return eligible_G & (scores_G <= cutoff + ZERO_SCORE_EPS)


def select_groups(scores: jax.Array, *, strategy: str = "top_p", value: float = 0.9,
                  filter_type: str = "largest", prob_mode: str = "linear", include_zero: bool = True,
                  selection_eps: float = 0.01) -> jax.Array:
  """bool[G] mask of the groups to train on (SPEC §6).

  - `top_p` + `linear` (paper default): sort by score, keep the shortest
    prefix whose summed score reaches `value`·Σscore − `selection_eps`,
    stopping at a score ≤ 0; if that sum is never reached nothing is kept.
  - `top_p` + `softmax`: nucleus over softmax(score) (of −score for
    `smallest`) with mass `value`.
  - `top_k`: keep max(1, int(value·G)); `top_k_abs`: keep int(value) groups.
  - `min_p`: keep score ≥ value·max (`largest`) or ≤ min/value (`smallest`).
  `include_zero=False` first drops groups with |score| ≤ 1e-10 (they are never
  kept and do not count as "eligible"). `top_p` with value ≥ 1 keeps every
  eligible group. Ties keep the lower group index first. Only `scores` may be
  traced; the settings are static Python values (jit with them closed over or
  as static arguments).
  """
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
  if filter_type not in FILTER_TYPES:
    raise ValueError(f"filter_type must be one of {FILTER_TYPES}, got {filter_type!r}")
  if prob_mode not in PROB_MODES:
    raise ValueError(f"prob_mode must be one of {PROB_MODES}, got {prob_mode!r}")
  if not value > 0:
    raise ValueError(f"filter value must be positive, got {value}")
  scores_G = jnp.asarray(scores, jnp.float32)
  if scores_G.ndim != 1:
    raise ValueError(f"scores must be one value per group, got shape {scores_G.shape}")

  eligible_G = jnp.ones(scores_G.shape, bool) if include_zero else jnp.abs(scores_G) > ZERO_SCORE_EPS
  descending = filter_type == "largest"
  if strategy == "top_p":
    if value >= 1.0:
      return eligible_G
    if prob_mode == "linear":
      return _linear_top_p(scores_G, eligible_G, value, descending, selection_eps)
    return _softmax_top_p(scores_G, eligible_G, value, descending)
  if strategy == "top_k":
    return _top_k(scores_G, eligible_G, int(value * scores_G.shape[0]), descending)
  if strategy == "top_k_abs":
    return _top_k(scores_G, eligible_G, int(value), descending)
  return _min_p(scores_G, eligible_G, value, descending)


def episode_mask(keep_G: jax.Array, group_ids_B: jax.Array) -> jax.Array:
  """Expands a group mask to episodes: bool[B] = keep_G[group_ids_B]."""
  return keep_G[group_ids_B]


def loss_scale(keep_G: jax.Array, mode: str = "none") -> jax.Array:
  """Multiplier of the advantages after filtering: 1, kept ratio, or its square root.

  `linear` scales by the kept fraction of groups (SPEC §6); the paper's text
  scales by ρ instead, which the kept ratio approximates for top_p. The paper's
  prose says it scales the loss; the reference scales the advantages, as the
  update does, so only the policy-gradient term shrinks (not the entropy bonus,
  the KL loss or the critic's loss).
  """
  if mode not in LOSS_SCALINGS:
    raise ValueError(f"loss scaling must be one of {LOSS_SCALINGS}, got {mode!r}")
  kept_ratio = jnp.mean(keep_G.astype(jnp.float32))
  if mode == "linear":
    return kept_ratio
  if mode == "sqrt":
    return jnp.sqrt(kept_ratio)
  return jnp.ones((), jnp.float32)


def filter_metrics(rewards: jax.Array, keep_G: jax.Array, scores_G: jax.Array,
                   group_ids: jax.Array | None = None, num_groups: int | None = None,
                   valid: jax.Array | None = None) -> dict[str, jax.Array]:
  """Scalar metrics of one filtering step (RAGEN's `rollout/*` family).

  In-group reward std (ddof 1), mean and max averaged over all groups and over
  the kept ones (0 when none is kept); kept count and ratio; number of groups
  with |score| ≤ 1e-10; and `filter_empty` (1.0 when nothing is kept).
  """
  valid_flat = None if valid is None else valid.reshape(-1)
  rewards, group_ids, num_groups = _as_flat(rewards, group_ids, num_groups)
  stats = group_stats(rewards, group_ids, num_groups, valid_flat, ddof=1)
  kept_G = keep_G.astype(jnp.float32)
  kept_count = jnp.sum(kept_G)

  def chosen_mean(x_G):
    return jnp.sum(jnp.where(keep_G, x_G, 0.0)) / jnp.maximum(kept_count, 1.0)

  per_group = {"std": stats.std, "mean": stats.mean, "max": stats.max}
  metrics = {f"in_group_reward_{k}": jnp.mean(v) for k, v in per_group.items()}
  metrics |= {f"chosen_in_group_reward_{k}": chosen_mean(v) for k, v in per_group.items()}
  metrics |= {
      "filter_kept_count": kept_count,
      "filter_kept_ratio": kept_count / num_groups,
      "filter_zero_count": jnp.sum(jnp.abs(scores_G) <= ZERO_SCORE_EPS).astype(jnp.float32),
      "filter_empty": (kept_count == 0).astype(jnp.float32),
  }
  return metrics
