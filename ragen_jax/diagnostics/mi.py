"""Mutual-information proxies for template collapse (SPEC §5).

Input is a cross-scoring matrix: row r is one sampled reasoning z_r, column j
one prompt x_j, entry = log-prob of z_r given x_j under the current policy.
`own_col[r]` is the column of r's own prompt; `col_equiv[i, j]` marks columns
with identical prompt tokens (a hit on any of them counts; the diagonal is
always set). `row_mask` (optional, bool[R]) drops padding rows from every mean
so R can stay fixed under jit.

Ties: retrieval ranks columns by score with ties broken towards the lower
column index (`jax.lax.top_k`, like `torch.argmax`); a row hits at k when any
column equivalent to its own is among those k.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

RETRIEVAL_KS = (1, 2, 4, 8)
ZSCORE_STD_FLOOR = 1e-3
MARGINAL_CONVENTIONS = ("paper", "code")


def _row_mean(x_R: jax.Array, row_mask_R: jax.Array) -> jax.Array:
  return jnp.sum(jnp.where(row_mask_R, x_R, 0.0)) / jnp.maximum(jnp.sum(row_mask_R), 1)


def _row_std(x_R: jax.Array, row_mask_R: jax.Array) -> jax.Array:
  """Population std (ddof 0) over the masked rows."""
  return jnp.sqrt(_row_mean(jnp.square(x_R - _row_mean(x_R, row_mask_R)), row_mask_R))


def _check_inputs(scores_RN, own_col_R, col_equiv_NN, row_mask_R):
  if scores_RN.ndim != 2:
    raise ValueError(f"scores must be [R, N], got shape {scores_RN.shape}")
  num_rows, num_cols = scores_RN.shape
  if own_col_R.shape != (num_rows,):
    raise ValueError(f"own_col must be [R={num_rows}], got shape {own_col_R.shape}")
  if col_equiv_NN is not None and col_equiv_NN.shape != (num_cols, num_cols):
    raise ValueError(f"col_equiv must be [N, N] = [{num_cols}, {num_cols}], got shape {col_equiv_NN.shape}")
  if row_mask_R is not None and row_mask_R.shape != (num_rows,):
    raise ValueError(f"row_mask must be [R={num_rows}], got shape {row_mask_R.shape}")


def _family(scores_RN, matched_R, marginal_R, own_col_R, col_equiv_NN, row_mask_R, suffix):
  """The metric family of one score matrix, given its matched and marginal terms."""
  num_cols = scores_RN.shape[1]
  equiv_own_RN = col_equiv_NN[own_col_R]
  gap_R = matched_R - marginal_R
  marginal_std = _row_std(marginal_R, row_mask_R)
  _, top_RK = jax.lax.top_k(scores_RN, min(max(RETRIEVAL_KS), num_cols))
  hit_in_top_RK = jnp.cumsum(jnp.take_along_axis(equiv_own_RN, top_RK, axis=1), axis=1) > 0
  chance = _row_mean(jnp.sum(equiv_own_RN, axis=1) / num_cols, row_mask_R)
  accuracy = {k: _row_mean(hit_in_top_RK[:, min(k, num_cols) - 1], row_mask_R) for k in RETRIEVAL_KS}
  metrics = {
      "mi_estimate": _row_mean(gap_R, row_mask_R),
      "mi_upper_bound": jnp.asarray(math.log(num_cols), jnp.float32),
      "conditional_entropy_est": -_row_mean(matched_R, row_mask_R),
      "reasoning_entropy_est": -_row_mean(marginal_R, row_mask_R),
      "retrieval_accuracy": accuracy[1],
      **{f"retrieval_accuracy_at_{k}": accuracy[k] for k in RETRIEVAL_KS[1:]},
      "retrieval_chance_level": chance,
      "retrieval_above_chance": accuracy[1] - chance,
      "mi_zscore": _row_mean(gap_R / (marginal_std + ZSCORE_STD_FLOOR), row_mask_R),
      "marginal_std": marginal_std,
  }
  return {name + suffix: value for name, value in metrics.items()}


def _prepare(scores_RN, own_col, col_equiv, row_mask):
  _check_inputs(scores_RN, own_col, col_equiv, row_mask)
  num_rows, num_cols = scores_RN.shape
  identity_NN = jnp.eye(num_cols, dtype=bool)
  col_equiv_NN = identity_NN if col_equiv is None else col_equiv.astype(bool) | identity_NN
  row_mask_R = jnp.ones(num_rows, bool) if row_mask is None else row_mask.astype(bool)
  return scores_RN.astype(jnp.float32), own_col.astype(jnp.int32), col_equiv_NN, row_mask_R


def _matched(scores_RN, own_col_R):
  return jnp.take_along_axis(scores_RN, own_col_R[:, None], axis=1)[:, 0]


def _log_mean_exp(scores_RN):
  return jax.nn.logsumexp(scores_RN, axis=1) - math.log(scores_RN.shape[1])


def mi_metrics(logp: jax.Array, own_col: jax.Array, col_equiv: jax.Array | None = None,
               row_mask: jax.Array | None = None) -> dict[str, jax.Array]:
  """MI proxy family of one matrix `logp` float[R, N] (scalar float32 values).

  matched_r = logp[r, c(r)], marginal_r = logsumexp_j logp[r, j] − log N;
  `mi_estimate` = mean(matched − marginal) ≤ `mi_upper_bound` = log N;
  `conditional_entropy_est` = −mean(matched); `reasoning_entropy_est` =
  −mean(marginal); `retrieval_accuracy[_at_k]` (k ≥ N gives 1);
  `retrieval_chance_level` = mean_r |equiv(c(r))| / N; `mi_zscore` =
  mean((matched − marginal) / (std(marginal) + 1e-3)); `marginal_std`.
  """
  logp_RN, own_col_R, col_equiv_NN, row_mask_R = _prepare(logp, own_col, col_equiv, row_mask)
  return _family(logp_RN, _matched(logp_RN, own_col_R), _log_mean_exp(logp_RN), own_col_R, col_equiv_NN,
                 row_mask_R, suffix="")


def mi_metrics_from_scores(sum_logp: jax.Array, lengths: jax.Array, own_col: jax.Array,
                           col_equiv: jax.Array | None = None, row_mask: jax.Array | None = None,
                           marginal: str = "paper") -> dict[str, jax.Array]:
  """Both metric families from summed log-probs S float[R, N] and reasoning lengths int[R].

  Per-token family (no suffix) on L = S / length; summed family (`_seq`) on S.
  The per-token marginal follows `marginal`:
    - "paper" (default): (logsumexp_j S[r, j] − log N) / length_r;
    - "code" (reference implementation): logsumexp_j L[r, j] − log N.
  """
  if marginal not in MARGINAL_CONVENTIONS:
    raise ValueError(f"marginal must be one of {MARGINAL_CONVENTIONS}, got {marginal!r}")
  sum_logp_RN, own_col_R, col_equiv_NN, row_mask_R = _prepare(sum_logp, own_col, col_equiv, row_mask)
  if lengths.shape != own_col_R.shape:
    raise ValueError(f"lengths must be [R={own_col_R.shape[0]}], got shape {lengths.shape}")
  lengths_R = jnp.maximum(lengths.astype(jnp.float32), 1.0)
  mean_logp_RN = sum_logp_RN / lengths_R[:, None]
  marginal_seq_R = _log_mean_exp(sum_logp_RN)
  marginal_R = marginal_seq_R / lengths_R if marginal == "paper" else _log_mean_exp(mean_logp_RN)
  per_token = _family(mean_logp_RN, _matched(mean_logp_RN, own_col_R), marginal_R, own_col_R, col_equiv_NN,
                      row_mask_R, suffix="")
  summed = _family(sum_logp_RN, _matched(sum_logp_RN, own_col_R), marginal_seq_R, own_col_R, col_equiv_NN,
                   row_mask_R, suffix="_seq")
  return per_token | summed


@flax.struct.dataclass
class ZscoreEMA:
  """EMA of std(marginal) for one sampling variant and metric family (a checkpointable pytree)."""
  marginal_std: jax.Array  # float32[], meaningless while steps == 0
  steps: jax.Array  # int32[], updates so far

  @classmethod
  def init(cls) -> "ZscoreEMA":
    return cls(marginal_std=jnp.zeros((), jnp.float32), steps=jnp.zeros((), jnp.int32))


def update_zscore_ema(state: ZscoreEMA, mi_estimate: jax.Array, marginal_std: jax.Array,
                      decay: float = 0.9) -> tuple[ZscoreEMA, jax.Array]:
  """Folds this step's std(marginal) into the EMA; returns (state, mi_zscore_ema).

  The EMA starts at the first value; mi_zscore_ema = mi_estimate /
  (EMA + 1e-3), i.e. mean((matched − marginal) / (EMA + 1e-3)). A non-finite std(marginal) leaves the
  state as it was (the train state never holds a NaN); its z-score is then non-finite too.
  """
  ema = jnp.where(state.steps > 0, decay * state.marginal_std + (1.0 - decay) * marginal_std, marginal_std)
  finite = jnp.isfinite(marginal_std)
  new_state = ZscoreEMA(marginal_std=jnp.where(finite, ema, state.marginal_std).astype(jnp.float32),
                        steps=state.steps + finite.astype(state.steps.dtype))
  return new_state, mi_estimate / (ema + ZSCORE_STD_FLOOR)


def apply_zscore_emas(states: dict[str, ZscoreEMA], variant: str, metrics: dict[str, jax.Array],
                      decay: float = 0.9) -> tuple[dict[str, ZscoreEMA], dict[str, jax.Array]]:
  """Updates the EMAs of one sampling variant for each family present in `metrics`.

  `states` maps "<variant>" / "<variant>_seq" to `ZscoreEMA` (missing ones
  start fresh). Returns the new mapping and `metrics` plus `mi_zscore_ema`
  (and `mi_zscore_ema_seq`).
  """
  states, metrics = dict(states), dict(metrics)
  for suffix in ("", "_seq"):
    if f"mi_estimate{suffix}" not in metrics:
      continue
    key = variant + suffix
    states[key], metrics[f"mi_zscore_ema{suffix}"] = update_zscore_ema(
        states.get(key, ZscoreEMA.init()), metrics[f"mi_estimate{suffix}"], metrics[f"marginal_std{suffix}"], decay)
  return states, metrics
