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


def test_empty_iterations_skip_the_low_std_window():
  # Reference rules: only successful (non-empty) iterations enter the baseline and the window.
  steps = [(False, 1.0)] * 10 + [(False, 0.05), (True, 0.0)] * 5  # baseline 1.0, threshold 0.1
  state, reasons = iterate(EarlyStopConfig(std_window=10), steps)  # the reference code's window
  assert set(reasons) == {None}  # counting every iteration stopped at the 20th
  assert (state.iterations, state.low_std_streak, state.empty_streak) == (15, 5, 1)
  _, reasons = iterate(EarlyStopConfig(), steps)  # window 5: the fifth kept low-std iteration
  assert reasons[:18] == [None] * 18 and "5 consecutive non-empty" in reasons[18]


def test_empty_iterations_stay_out_of_the_baseline():
  state, _ = iterate(EarlyStopConfig(), [(True, 0.0)] * 3 + [(False, 1.0)] * 10)
  assert (state.iterations, state.std_baseline_sum) == (10, 10.0)
  # 0.09 < 0.1 x 1.0 (with the empty iterations counted the baseline would be 0.7 and 0.09 not low)
  _, reasons = iterate(EarlyStopConfig(), [(False, 0.09)] * 5, state)
  assert reasons[:4] == [None] * 4 and reasons[4] is not None


def validate(state, cfg, runs):
  reasons = []
  for success, empty in runs:
    state, reason = after_validation(state, cfg, success=success, filter_empty=empty)
    reasons.append(reason)
  return state, reasons


def test_validation_failures_in_a_row():
  cfg = EarlyStopConfig()
  _, reasons = validate(EarlyStopState(), cfg, [(s, False) for s in [0.0, 0.005, 0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.009]])
  assert reasons[:8] == [None] * 8 and "5 validations" in reasons[8]
  state, reason = after_validation(EarlyStopState(val_failure_streak=4), dataclasses.replace(
      cfg, val_failure_enabled=False), success=0.0, filter_empty=False)
  assert reason is None and state.val_failure_streak == 5


def test_validation_after_an_empty_iteration_does_not_count():
  cfg = EarlyStopConfig()
  state, reasons = validate(EarlyStopState(val_failure_streak=4), cfg, [(0.0, True), (0.5, True)])
  assert reasons == [None, None] and state.val_failure_streak == 4  # neither a failure nor a reset
  _, reasons = validate(state, cfg, [(0.0, False)])
  assert "5 validations" in reasons[0]


def test_state_round_trips_through_dict():
  state, _ = iterate(EarlyStopConfig(), [(True, 1.0), (False, 2.0), (True, 0.5)])
  assert EarlyStopState.from_dict(state.to_dict()) == state
  assert state.to_dict() == {"empty_streak": 1, "iterations": 1, "std_baseline_sum": 2.0, "low_std_streak": 0,
                             "val_failure_streak": 0}
