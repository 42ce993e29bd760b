"""Template-collapse alarm over logged scalars (host-side).

Template collapse shows as input dependence (MI z-score) falling while the
policy entropy holds steady. The alarm looks at the last `alarm_window` logged
points of (mi_zscore, entropy, mi_estimate) and fires when
  - the MI z-score fell by at least `alarm_drop` relative to the window's first
    value: (z_first − z_last) / z_first ≥ alarm_drop, with z_first > 0, and by at
    least `alarm_min_drop` in absolute terms (small z-scores swing by a few
    hundredths between iterations; relative drops of those are noise),
  - the MI estimate itself fell by at least `alarm_drop` relative to its first value
    too: the z-score divides by the rows' spread of the marginal log-prob, which one
    outlier row can inflate twentyfold while the MI holds (docs/results.md, the
    correlation study: every false alarm of 47 study runs was one), and
  - every entropy in the window stayed within `alarm_entropy_tolerance` (relative)
    of the window's first entropy.
A non-positive starting z-score or MI estimate, or any non-finite value, never fires.

The entropy band (±30%) is as wide as the entropy's own noise: at 64 episodes an
iteration the per-token entropy of healthy study runs moved 17% over a 4-point
window in the median window (31% at the 90th percentile), and a ±10% band held in
1 window of 5, so the alarm was off most of the time, collapsed or not. What keeps
healthy runs silent is the MI estimate's fall, which no healthy run showed
(docs/results.md, "The alarm's entropy band").
"""

from __future__ import annotations

import dataclasses
import math

from ragen_jax.diagnostics.collapse import CollapseConfig


@dataclasses.dataclass(frozen=True)
class AlarmState:
  """The most recent (mi_zscore, entropy, mi_estimate) points, oldest first."""
  history: tuple[tuple[float, float, float], ...] = ()

  def to_dict(self) -> dict:
    return {"history": [list(p) for p in self.history]}

  @classmethod
  def from_dict(cls, d: dict) -> "AlarmState":
    # points saved before the MI estimate was kept read it as NaN: they never fire
    return cls(history=tuple((float(p[0]), float(p[1]), float(p[2]) if len(p) > 2 else math.nan)
                             for p in d["history"]))


@dataclasses.dataclass(frozen=True)
class AlarmResult:
  fired: bool
  message: str  # empty unless fired


def update_alarm(state: AlarmState, cfg: CollapseConfig, mi_zscore: float, entropy: float,
                 mi_estimate: float) -> tuple[AlarmState, AlarmResult]:
  """Appends one point and evaluates the rule on the last `cfg.alarm_window` points."""
  history = (state.history + ((float(mi_zscore), float(entropy), float(mi_estimate)),))[-cfg.alarm_window:]
  new_state = AlarmState(history=history)
  if len(history) < cfg.alarm_window or not all(math.isfinite(v) for point in history for v in point):
    return new_state, AlarmResult(False, "")
  (z_first, h_first, mi_first), (z_last, _, mi_last) = history[0], history[-1]
  if z_first <= 0 or mi_first <= 0:
    return new_state, AlarmResult(False, "")
  relative_drop, mi_drop = (z_first - z_last) / z_first, (mi_first - mi_last) / mi_first
  entropy_shift = max(abs(h - h_first) for _, h, _ in history) / max(abs(h_first), 1e-12)
  if (relative_drop >= cfg.alarm_drop and z_first - z_last >= cfg.alarm_min_drop
      and mi_drop >= cfg.alarm_drop and entropy_shift <= cfg.alarm_entropy_tolerance):
    return new_state, AlarmResult(True, (
        f"template collapse suspected: MI z-score fell {relative_drop:.0%} ({z_first:.4g} -> {z_last:.4g}), the MI "
        f"estimate {mi_drop:.0%} ({mi_first:.4g} -> {mi_last:.4g} nats per token), "
        f"over the last {cfg.alarm_window} points while entropy moved at most {entropy_shift:.1%} "
        f"({h_first:.4g} -> {history[-1][1]:.4g}; tolerance {cfg.alarm_entropy_tolerance:.0%})"))
  return new_state, AlarmResult(False, "")
