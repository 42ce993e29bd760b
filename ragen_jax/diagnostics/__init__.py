"""Collapse diagnostics: MI proxies, cross-scoring, template-collapse alarm, gradient buckets."""

from ragen_jax.diagnostics.collapse import (CollapseConfig, init_diagnostics_state, make_diagnostics_fn,
                                            make_grad_analysis_fn)
from ragen_jax.diagnostics.mi import (ZscoreEMA, apply_zscore_emas, mi_metrics, mi_metrics_from_scores,
                                      update_zscore_ema)

__all__ = ["CollapseConfig", "ZscoreEMA", "apply_zscore_emas", "init_diagnostics_state", "make_diagnostics_fn",
           "make_grad_analysis_fn", "mi_metrics", "mi_metrics_from_scores", "update_zscore_ema"]
