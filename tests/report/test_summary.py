"""Run plots: every panel ticks whole iterations, and quantities of different scales get their own panels."""

import matplotlib.pyplot as plt
import numpy as np

from ragen_jax.report.summary import PANELS, run_figure

MI_ZSCORE, RETRIEVAL = "collapse/trajectory/mi_zscore", "collapse/trajectory/retrieval_accuracy"


def test_run_figure_ticks_whole_iterations_and_keeps_mi_zscore_apart_from_retrieval():
  rows = [{"step": 1, "train/score": -0.2, MI_ZSCORE: 3.5}, {"step": 2, "val/success": 0.25},
          {"step": 3, "train/score": 0.1, MI_ZSCORE: 12.0, RETRIEVAL: 0.5}]
  fig = run_figure(rows, "test", baseline={"val/success": 0.125})
  try:
    fig.canvas.draw()
    axes = fig.axes
    assert len(axes) == len(PANELS)
    for ax in axes:
      ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
      assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
    drawn = {line.get_label(): ax for ax in axes for line in ax.get_lines()}
    assert drawn[MI_ZSCORE] is not drawn[RETRIEVAL]
    np.testing.assert_array_equal(drawn["val/success"].get_lines()[0].get_xdata(), [0, 2])  # baseline at 0
  finally:
    plt.close(fig)
