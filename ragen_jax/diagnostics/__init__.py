"""Collapse diagnostics: MI proxies, template-collapse alarm, gradient buckets."""

from ragen_jax.diagnostics.mi import (ZscoreEMA, apply_zscore_emas, mi_metrics, mi_metrics_from_scores,
                                      update_zscore_ema)

__all__ = ["ZscoreEMA", "apply_zscore_emas", "mi_metrics", "mi_metrics_from_scores", "update_zscore_ema"]
