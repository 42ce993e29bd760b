"""Run plots: every panel ticks whole iterations, quantities of different scales get their own panels, null values
are left out; the metric table skips them too."""

import matplotlib.pyplot as plt
import numpy as np

from ragen_jax.report.summary import PANELS, metric_table, run_figure

MI_ZSCORE, RETRIEVAL = "collapse/trajectory/mi_zscore", "collapse/trajectory/retrieval_accuracy"
ROWS = [{"step": 1, "train/score": -0.2, MI_ZSCORE: 3.5, "update/pg_loss": None},  # null: a non-finite value
        {"step": 2, "val/success": 0.25, "update/pg_loss": 0.5, RETRIEVAL: None},
        {"step": 3, "train/score": 0.1, MI_ZSCORE: 12.0, RETRIEVAL: 0.5, "update/pg_loss": None}]


def test_run_figure_ticks_whole_iterations_keeps_mi_zscore_apart_from_retrieval_and_skips_nulls():
  fig = run_figure(ROWS, "test", baseline={"val/success": 0.125})
  try:
    fig.canvas.draw()
    axes = fig.axes
    assert len(axes) == len(PANELS)
    for ax in axes:
      ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
      assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
    panel_of = {line.get_label(): ax for ax in axes for line in ax.get_lines()}
    line_of = {line.get_label(): line for ax in axes for line in ax.get_lines()}
    assert panel_of[MI_ZSCORE] is not panel_of[RETRIEVAL]
    np.testing.assert_array_equal(line_of["val/success"].get_xdata(), [0, 2])  # the baseline at 0
    np.testing.assert_array_equal(line_of["update/pg_loss"].get_xdata(), [2])
    np.testing.assert_array_equal(line_of[RETRIEVAL].get_xdata(), [3])
  finally:
    plt.close(fig)


def test_metric_table_counts_only_logged_values():
  table = metric_table(ROWS, ("train/score", RETRIEVAL, "update/pg_loss", "val/valid_action_rate"))
  assert table[2:] == ["| train/score | 2 | -0.2 | 0.1 | -0.2 | 0.1 |", f"| {RETRIEVAL} | 1 | 0.5 | 0.5 | 0.5 | 0.5 |",
                       "| update/pg_loss | 1 | 0.5 | 0.5 | 0.5 | 0.5 |"]
