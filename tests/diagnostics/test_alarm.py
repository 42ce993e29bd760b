"""Template-collapse alarm rule on logged (MI z-score, entropy) histories."""

import pytest

from ragen_jax.diagnostics.alarm import AlarmState, update_alarm
from ragen_jax.diagnostics.collapse import CollapseConfig


def run(points, cfg=CollapseConfig()):
  state, results = AlarmState(), []
  for z, h in points:
    state, result = update_alarm(state, cfg, z, h)
    results.append(result)
  return state, results


def test_fires_when_mi_falls_and_entropy_holds():
  _, results = run([(2.0, 1.00), (1.6, 1.02), (1.2, 0.97), (0.8, 1.01)])
  assert [r.fired for r in results] == [False, False, False, True]
  message = results[-1].message
  assert "60%" in message and "2 -> 0.8" in message  # the MI drop, with both values
  assert "3.0%" in message and "1 -> 1.01" in message  # the entropy shift, with both values


def test_silent_when_entropy_also_collapses():
  _, results = run([(2.0, 1.0), (1.6, 0.9), (1.2, 0.8), (0.8, 0.7)])
  assert not any(r.fired for r in results)


def test_silent_when_drop_is_too_small_or_start_not_positive():
  _, results = run([(2.0, 1.0), (1.9, 1.0), (1.5, 1.0), (1.2, 1.0)])  # 40% < 50%
  assert not any(r.fired for r in results)
  _, results = run([(-1.0, 1.0), (-2.0, 1.0), (-3.0, 1.0), (-4.0, 1.0)])
  assert not any(r.fired for r in results)
  _, results = run([(2.0, 1.0), (float("nan"), 1.0), (1.0, 1.0), (0.5, 1.0)])
  assert not any(r.fired for r in results)


def test_silent_on_relative_drops_of_tiny_zscores():
  points = [(0.095, 0.80), (0.04, 0.81), (0.02, 0.80), (-0.003, 0.80)]  # fell 103%, but only by 0.098
  _, results = run(points)
  assert not any(r.fired for r in results)
  _, results = run(points, CollapseConfig(alarm_min_drop=0.05))
  assert results[-1].fired


def test_window_slides_over_the_latest_points():
  cfg = CollapseConfig(alarm_window=3, alarm_drop=0.5, alarm_entropy_tolerance=0.05)
  state, results = run([(4.0, 2.0), (4.0, 2.5), (3.0, 2.0), (2.0, 2.0), (1.4, 2.02)], cfg)
  # windows: (4, 4, 3) no; (4, 3, 2) entropy starts 2.5 → moved 20%; (3, 2, 1.4) drop 53%, entropy 1%.
  assert [r.fired for r in results] == [False, False, False, False, True]
  assert len(state.history) == 3


def test_state_round_trips_through_dict():
  state, _ = run([(2.0, 1.0), (1.5, 1.0)])
  restored = AlarmState.from_dict(state.to_dict())
  assert restored == state
  _, a = update_alarm(state, CollapseConfig(alarm_window=3), 0.5, 1.0)
  _, b = update_alarm(restored, CollapseConfig(alarm_window=3), 0.5, 1.0)
  assert a == b and a.fired


@pytest.mark.parametrize("kwargs", [dict(alarm_window=1), dict(alarm_drop=0.0), dict(alarm_entropy_tolerance=-0.1),
                                    dict(alarm_min_drop=-0.1)])
def test_bad_config_raises(kwargs):
  with pytest.raises(ValueError):
    CollapseConfig(**kwargs)
