"""ragen_jax: multi-turn agent RL for LLMs in JAX, with RAGEN-2's collapse diagnostics."""

__version__ = "0.1.0"
