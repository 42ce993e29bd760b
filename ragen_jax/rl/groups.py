"""Per-group reward statistics over a flat batch of episodes.

Episodes carry an int group id in [0, num_groups); `num_groups` is static so
every statistic has a fixed shape under jit. Groups stored as a [G, S] matrix
convert with `flatten_groups`.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class GroupStats:
  """Statistics of one scalar per episode, per group (all float32[G])."""
  count: jax.Array  # valid episodes in the group
  mean: jax.Array
  var: jax.Array  # sum((x - mean)^2) / (count - ddof); 0 when count <= ddof
  max: jax.Array  # -inf for an empty group

  @property
  def std(self) -> jax.Array:
    return jnp.sqrt(self.var)


def flatten_groups(values_GS: jax.Array) -> tuple[jax.Array, jax.Array]:
  """[G, S] group-major matrix → (values[G*S], group_ids int32[G*S])."""
  num_groups, group_size = values_GS.shape
  group_ids = jnp.repeat(jnp.arange(num_groups, dtype=jnp.int32), group_size)
  return values_GS.reshape(-1), group_ids


def group_stats(values_B: jax.Array, group_ids_B: jax.Array, num_groups: int,
                valid_B: jax.Array | None = None, ddof: int = 1) -> GroupStats:
  """Count, mean, variance (with `ddof`) and max of `values_B` per group.

  `valid_B` (bool[B], default all) excludes padding episodes from every
  statistic. A group with `count <= ddof` gets variance 0: no spread measured.
  """
  values_B = jnp.asarray(values_B, jnp.float32)
  valid_B = jnp.ones(values_B.shape, bool) if valid_B is None else valid_B.astype(bool)
  weight_B = valid_B.astype(jnp.float32)

  def per_group_sum(x_B):
    return jax.ops.segment_sum(x_B * weight_B, group_ids_B, num_segments=num_groups)

  count_G = per_group_sum(jnp.ones_like(values_B))
  mean_G = per_group_sum(values_B) / jnp.maximum(count_G, 1.0)
  sq_dev_G = per_group_sum(jnp.square(values_B - mean_G[group_ids_B]))
  dof_G = count_G - ddof
  var_G = jnp.where(dof_G > 0, sq_dev_G / jnp.maximum(dof_G, 1.0), 0.0)
  max_G = jax.ops.segment_max(jnp.where(valid_B, values_B, -jnp.inf), group_ids_B,
                              num_segments=num_groups)
  return GroupStats(count=count_G, mean=mean_G, var=var_G, max=max_G)
