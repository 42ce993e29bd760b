"""RL update math: SNR-Aware group filtering, advantages, losses, presets, early stopping.

Pure, jittable functions over [B, T] token arrays and per-group scores; the
jitted update step (`update.py`) composes them.
"""
