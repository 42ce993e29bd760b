"""Template-collapse alarm rule on logged (MI z-score, entropy, MI estimate) histories."""

import pytest

from ragen_jax.diagnostics.alarm import AlarmState, update_alarm
from ragen_jax.diagnostics.collapse import CollapseConfig


def run(points, cfg=CollapseConfig()):
  state, results = AlarmState(), []
  for z, h, mi in points:
    state, result = update_alarm(state, cfg, z, h, mi)
    results.append(result)
  return state, results


def test_fires_when_mi_falls_and_entropy_holds():
  _, results = run([(2.0, 1.00, 0.40), (1.6, 1.02, 0.30), (1.2, 0.97, 0.20), (0.8, 1.01, 0.10)])
  assert [r.fired for r in results] == [False, False, False, True]
  message = results[-1].message
  assert "60%" in message and "2 -> 0.8" in message  # the z-score drop, with both values
  assert "75%" in message and "0.4 -> 0.1" in message  # the MI estimate's drop
  assert "3.0%" in message and "1 -> 1.01" in message  # the entropy shift, with both values


def test_silent_when_entropy_also_collapses():
  _, results = run([(2.0, 1.0, 0.4), (1.6, 0.85, 0.3), (1.2, 0.7, 0.2), (0.8, 0.55, 0.1)])  # entropy fell 45%
  assert not any(r.fired for r in results)


def test_fires_on_a_logged_collapse_whose_entropy_moved_20_percent():
  # the collapse study's fourth arm, no filter, RL seed 1 (docs/results.md), iterations 3-9: the MI estimate fell
  # 62% and the z-score 79% while the entropy, noisy at 64 episodes an iteration, moved 20%
  points = [(0.736, 0.207, 0.112), (0.379, 0.206, 0.070), (0.030, 0.200, 0.055), (0.157, 0.166, 0.043)]
  _, results = run(points)
  assert [r.fired for r in results] == [False, False, False, True]
  assert "19.8%" in results[-1].message and "tolerance 30%" in results[-1].message
  _, results = run(points, CollapseConfig(alarm_entropy_tolerance=0.1))  # the band before: missed it
  assert not any(r.fired for r in results)


def test_silent_when_the_zscore_falls_but_the_mi_estimate_holds():
  # the correlation study's false alarms (docs/results.md): at seed 1, iteration 7, one outlier row inflated the
  # marginal's spread 20x, so the z-score fell from 1.5 to 0.06 while the MI estimate went 0.136 -> 0.109
  points = [(1.44, 0.103, 0.130), (1.51, 0.105, 0.136), (1.60, 0.104, 0.133), (0.058, 0.097, 0.109)]
  _, results = run(points)
  assert not any(r.fired for r in results)
  _, results = run(points[:3] + [(0.058, 0.097, 0.060)])  # the MI itself fell 54% too: fires
  assert results[-1].fired


def test_silent_when_drop_is_too_small_or_start_not_positive():
  _, results = run([(2.0, 1.0, 0.4), (1.9, 1.0, 0.3), (1.5, 1.0, 0.2), (1.2, 1.0, 0.1)])  # 40% < 50%
  assert not any(r.fired for r in results)
  _, results = run([(-1.0, 1.0, 0.4), (-2.0, 1.0, 0.3), (-3.0, 1.0, 0.2), (-4.0, 1.0, 0.1)])
  assert not any(r.fired for r in results)
  _, results = run([(2.0, 1.0, 0.0), (1.6, 1.0, 0.0), (1.2, 1.0, -0.1), (0.8, 1.0, -0.2)])  # no MI to lose
  assert not any(r.fired for r in results)
  _, results = run([(2.0, 1.0, 0.4), (float("nan"), 1.0, 0.3), (1.0, 1.0, 0.2), (0.5, 1.0, 0.1)])
  assert not any(r.fired for r in results)


def test_silent_on_relative_drops_of_tiny_zscores():
  points = [(0.095, 0.80, 0.02), (0.04, 0.81, 0.01), (0.02, 0.80, 0.005), (-0.003, 0.80, 0.0)]  # fell 103%, by 0.098
  _, results = run(points)
  assert not any(r.fired for r in results)
  _, results = run(points, CollapseConfig(alarm_min_drop=0.05))
  assert results[-1].fired


def test_window_slides_over_the_latest_points():
  cfg = CollapseConfig(alarm_window=3, alarm_drop=0.5, alarm_entropy_tolerance=0.05)
  state, results = run([(4.0, 2.0, 0.8), (4.0, 2.5, 0.8), (3.0, 2.0, 0.6), (2.0, 2.0, 0.4), (1.4, 2.02, 0.2)], cfg)
  # windows: (4, 4, 3) no; (4, 3, 2) entropy starts 2.5 → moved 20%; (3, 2, 1.4) drop 53%, entropy 1%.
  assert [r.fired for r in results] == [False, False, False, False, True]
  assert len(state.history) == 3


def test_state_round_trips_through_dict():
  state, _ = run([(2.0, 1.0, 0.4), (1.5, 1.0, 0.3)])
  restored = AlarmState.from_dict(state.to_dict())
  assert restored == state
  _, a = update_alarm(state, CollapseConfig(alarm_window=3), 0.5, 1.0, 0.1)
  _, b = update_alarm(restored, CollapseConfig(alarm_window=3), 0.5, 1.0, 0.1)
  assert a == b and a.fired
  # a checkpoint's history saved before the MI estimate was kept: those points never fire
  older = AlarmState.from_dict({"history": [[2.0, 1.0], [1.5, 1.0]]})
  assert not update_alarm(older, CollapseConfig(alarm_window=3), 0.5, 1.0, 0.1)[1].fired


@pytest.mark.parametrize("kwargs", [dict(alarm_window=1), dict(alarm_drop=0.0), dict(alarm_entropy_tolerance=-0.1),
                                    dict(alarm_min_drop=-0.1)])
def test_bad_config_raises(kwargs):
  with pytest.raises(ValueError):
    CollapseConfig(**kwargs)
