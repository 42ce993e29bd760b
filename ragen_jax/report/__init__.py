"""Metric writers, plots and run reports."""
