"""Orbax checkpoints of the train state plus the host-side loop state (JSON).

A checkpoint that fails to restore is reported and the previous one is tried,
so a broken save never loses the last good state.
"""

from __future__ import annotations

import logging
import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every `every` iterations into `directory`, keeping the newest `max_to_keep`."""

  def __init__(self, directory: str, every: int, max_to_keep: int):
    self.every = every
    if "://" not in directory:  # orbax wants absolute local paths; gs:// and other URLs pass through
      directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(directory, options=options)

  def maybe_save(self, iteration: int, state, host_state: dict, force: bool = False) -> bool:
    """Saves after `iteration` (1-based count of finished iterations) when due."""
    if not force and (self.every <= 0 or iteration % self.every):
      return False
    self._manager.save(iteration, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                           host=ocp.args.JsonSave(host_state)), force=force)
    self._manager.wait_until_finished()
    return True

  def restore_latest(self, abstract_state):
    """(iteration, state, host_state) of the newest checkpoint that restores, or None."""
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), host=ocp.args.JsonRestore()))
      except Exception as error:  # noqa: BLE001 - any failure means this checkpoint is unusable
        logging.error("checkpoint %d in %s cannot be restored (%s: %s); trying an older one", step,
                      self._manager.directory, type(error).__name__, error)
        continue
      return step, restored.state, restored.host
    return None

  def close(self):
    self._manager.close()


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) of a concrete pytree, for restoring into it."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
