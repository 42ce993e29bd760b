"""Early-stopping rules of SPEC §6, one at a time."""

import dataclasses

from ragen_jax.rl.early_stop import EarlyStopConfig, EarlyStopState, after_iteration, after_validation


def iterate(cfg, steps, state=EarlyStopState()):
  reasons = []
  for empty, std in steps:
    state, reason = after_iteration(state, cfg, filter_empty=empty, in_group_reward_std=std)
    reasons.append(reason)
  return state, reasons


def test_empty_filter_patience_and_reset():
  cfg = EarlyStopConfig()
  _, reasons = iterate(cfg, [(True, 1.0)] * 4 + [(False, 1.0)] + [(True, 1.0)] * 5)
  assert reasons[:9] == [None] * 9
  assert "5 consecutive" in reasons[9]
  _, reasons = iterate(dataclasses.replace(cfg, empty_filter_enabled=False), [(True, 1.0)] * 8)
  assert reasons == [None] * 8


def test_low_reward_std_against_first_iterations_baseline():
  cfg = EarlyStopConfig(empty_filter_enabled=False)
  warmup = [(False, 1.0)] * 5 + [(False, 3.0)] * 5  # baseline = 2.0, threshold 0.2
  low = [(False, 0.1)] * 4 + [(False, 0.5)] + [(False, 0.19)] * 5
  _, reasons = iterate(cfg, warmup + low)
  assert reasons[:19] == [None] * 19  # the 0.5 at iteration 15 resets the streak
  assert "below 0.1 x baseline 2" in reasons[19] and "5 consecutive" in reasons[19]
  _, reasons = iterate(dataclasses.replace(cfg, std_window=10), warmup + [(False, 0.1)] * 10)
  assert reasons[:19] == [None] * 19 and reasons[19] is not None
  _, reasons = iterate(dataclasses.replace(cfg, low_std_enabled=False), warmup + [(False, 0.0)] * 20)
  assert set(reasons) == {None}


def test_low_std_during_baseline_does_not_count():
  _, reasons = iterate(EarlyStopConfig(), [(False, 0.0)] * 10 + [(False, 0.0)] * 4)
  assert set(reasons) == {None}  # baseline 0: 0 < 0.1·0 is false, never fires


def test_validation_failures_in_a_row():
  cfg, state = EarlyStopConfig(), EarlyStopState()
  reasons = []
  for success in [0.0, 0.005, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.009]:
    state, reason = after_validation(state, cfg, success)
    reasons.append(reason)
  assert reasons[:8] == [None] * 8 and "5 validations" in reasons[8]
  state, reason = after_validation(EarlyStopState(val_failure_streak=4), dataclasses.replace(
      cfg, val_failure_enabled=False), 0.0)
  assert reason is None and state.val_failure_streak == 5


def test_state_round_trips_through_dict():
  state, _ = iterate(EarlyStopConfig(), [(True, 1.0), (False, 2.0), (True, 0.5)])
  assert EarlyStopState.from_dict(state.to_dict()) == state
  assert state.to_dict() == {"empty_streak": 1, "iterations": 3, "std_baseline_sum": 3.5, "low_std_streak": 0,
                             "val_failure_streak": 0}
