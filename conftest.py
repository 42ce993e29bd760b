"""Repo-root conftest: makes `ragen_jax` and `envs` importable from a checkout."""
