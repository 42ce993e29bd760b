"""Early-stopping rules of SNR-Aware Filtering runs (SPEC §6), host-side.

Three independent rules, each switchable:
  - empty filter: stop after `empty_filter_patience` consecutive iterations in
    which the filter kept no group;
  - reward-std collapse: the baseline is the mean in-group reward std over the
    first `std_baseline_iters` iterations; stop once the std stays below
    `std_ratio` × baseline for `std_window` consecutive later iterations
    (paper 5, reference code 10);
  - validation failure: stop when validation success is below
    `val_success_floor` for `val_patience` validations in a row.
As in the reference, the last two rules count successful iterations only (RAGEN's "successful steps"): an
iteration whose filter kept nothing adds to the empty-filter streak and to nothing else; its reward std
enters neither the baseline nor the low-std window (the window's streak holds), and a validation after
it is not counted.
The state is a frozen dataclass that round-trips through `to_dict`/`from_dict`.
"""

from __future__ import annotations

import dataclasses

from ragen_jax.config import check


@dataclasses.dataclass(frozen=True)
class EarlyStopConfig:
  """The `early_stop` config section: thresholds of the three rules; a rule is off when its `*_enabled` is
  False."""
  empty_filter_enabled: bool = True
  empty_filter_patience: int = 5
  low_std_enabled: bool = True
  std_baseline_iters: int = 10
  std_ratio: float = 0.1
  std_window: int = 5  # paper; the reference code uses 10
  val_failure_enabled: bool = True
  val_success_floor: float = 0.01
  val_patience: int = 5

  def __post_init__(self):
    for name in ("empty_filter_patience", "std_baseline_iters", "std_window", "val_patience"):
      check(f"early_stop.{name}", getattr(self, name) >= 1, "must be >= 1", getattr(self, name))
    check("early_stop.std_ratio", self.std_ratio >= 0, "must be >= 0", self.std_ratio)


@dataclasses.dataclass(frozen=True)
class EarlyStopState:
  """Counters of the rules; all start at 0. `iterations` counts successful (non-empty) iterations."""
  empty_streak: int = 0
  iterations: int = 0
  std_baseline_sum: float = 0.0
  low_std_streak: int = 0
  val_failure_streak: int = 0

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "EarlyStopState":
    return cls(**d)


def after_iteration(state: EarlyStopState, cfg: EarlyStopConfig, *, filter_empty: bool,
                    in_group_reward_std: float) -> tuple[EarlyStopState, str | None]:
  """Advances the per-iteration rules; returns (new state, stop reason or None). An empty iteration
  (`filter_empty`) only advances the empty-filter streak."""
  if filter_empty:
    new = dataclasses.replace(state, empty_streak=state.empty_streak + 1)
    if cfg.empty_filter_enabled and new.empty_streak >= cfg.empty_filter_patience:
      return new, f"filter kept no group for {new.empty_streak} consecutive iterations"
    return new, None
  in_baseline = state.iterations < cfg.std_baseline_iters
  baseline_sum = state.std_baseline_sum + (in_group_reward_std if in_baseline else 0.0)
  low_std_streak = 0
  if not in_baseline:
    baseline = state.std_baseline_sum / cfg.std_baseline_iters
    low_std_streak = state.low_std_streak + 1 if in_group_reward_std < cfg.std_ratio * baseline else 0
  new = dataclasses.replace(state, empty_streak=0, iterations=state.iterations + 1, std_baseline_sum=baseline_sum,
                            low_std_streak=low_std_streak)
  if cfg.low_std_enabled and low_std_streak >= cfg.std_window:
    baseline = baseline_sum / cfg.std_baseline_iters
    return new, (f"in-group reward std {in_group_reward_std:.4g} below {cfg.std_ratio} x baseline "
                 f"{baseline:.4g} for {low_std_streak} consecutive non-empty iterations")
  return new, None


def after_validation(state: EarlyStopState, cfg: EarlyStopConfig, *, success: float,
                     filter_empty: bool) -> tuple[EarlyStopState, str | None]:
  """Advances the validation rule; returns (new state, stop reason or None). A validation after an empty
  iteration (`filter_empty`: the filter kept nothing in the iteration it follows) leaves the state alone."""
  if filter_empty:
    return state, None
  streak = state.val_failure_streak + 1 if success < cfg.val_success_floor else 0
  new = dataclasses.replace(state, val_failure_streak=streak)
  if cfg.val_failure_enabled and streak >= cfg.val_patience:
    return new, f"validation success below {cfg.val_success_floor} for {streak} validations in a row"
  return new, None
