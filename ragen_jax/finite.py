"""Finiteness checks of pytrees: one rule for the update guard, the checkpointer and loaded weights."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ragen_jax import mesh as mesh_lib


def _leaf_finite(x) -> jax.Array:
  """bool[]: an inexact (floating or complex) array free of NaN and ±inf; other dtypes always are."""
  return jnp.all(jnp.isfinite(x)) if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else jnp.array(True)


def all_finite(tree) -> jax.Array:
  """bool[]: every inexact leaf of `tree` is free of NaN and ±inf (traceable in jit)."""
  return jnp.all(jnp.stack([_leaf_finite(x) for x in jax.tree.leaves(tree)] + [jnp.array(True)]))


_finite_leaves = jax.jit(lambda tree: jax.tree.map(_leaf_finite, tree))


def first_nonfinite(tree) -> str | None:
  """The path of the first leaf of `tree` holding a NaN or ±inf (e.g. "['layers']['q_proj']['kernel']"), or None.

  One jitted reduction per leaf, then one small transfer: cheap next to loading or saving the tree."""
  flags = mesh_lib.fetch(_finite_leaves(tree))  # every process calls it
  bad = [path for path, ok in jax.tree_util.tree_flatten_with_path(flags)[0] if not ok]
  return jax.tree_util.keystr(bad[0]) if bad else None
