"""Orbax checkpoints of the train state plus the host-side loop state (JSON), that never go backwards.

* A state with a NaN or ±inf anywhere is never saved (`maybe_save` refuses it), and a checkpoint that restores
  to one counts as broken, so rotation can only ever drop older finite checkpoints for newer finite ones.
* Restoring tries the newest checkpoint first and falls back to older ones. Once an older one restores (so the
  config fits the checkpoints), each newer, broken one is moved aside (renamed `<step>.broken-<time>`, kept for
  inspection) and the manager is reloaded: Orbax saves no step at or below the newest step it sees, so a broken
  step left in place would silently cancel every save up to it.
* When checkpoints exist but none restores, `restore_latest` raises `RestoreError` instead of starting afresh,
  and moves nothing.
* Saves run in the background (Orbax async): `maybe_save` returns once the state is copied off the devices, and
  the next save, a restore, `wait` and `close` wait for it. A save is written to a temporary directory renamed
  into place when complete, so a process killed mid-save leaves the previous checkpoint the newest (a later run's
  first save deletes the leftovers).
* Saves start one at a time across the process (`_SAVE_STARTS`), so runs in several threads (the demo's environments)
  can checkpoint side by side: Orbax keeps the id of the save being started, and the signals its background commit
  waits for, in process-wide state, and two saves started at once from two threads mix them up (a save fails or
  waits forever).
"""

from __future__ import annotations

import logging
import threading
import time

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from ragen_jax import paths
from ragen_jax.config import UserError
from ragen_jax.finite import first_nonfinite

_SAVE_STARTS = threading.Lock()


class RestoreError(UserError):
  """Checkpoints exist but none can be restored into this run's state."""


class Checkpointer:
  """Saves every `every` iterations into `directory` (local or `gs://`), keeping the newest `max_to_keep`."""

  def __init__(self, directory: str, every: int, max_to_keep: int):
    self.every = every
    self.directory = paths.path(directory)  # orbax wants absolute local paths; gs:// URLs pass through
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, cleanup_tmp_directories=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def steps(self) -> list[int]:
    """The iterations that have a checkpoint, oldest first."""
    return sorted(self._manager.all_steps())

  def maybe_save(self, iteration: int, state, host_state: dict, force: bool = False) -> bool:
    """Saves after `iteration` (1-based count of finished iterations) when due or `force`d, unless `state` holds
    a non-finite value (logged; the checkpoints on disk stay as they were). Returns whether it saved; the files
    are written in the background."""
    if not force and (self.every <= 0 or iteration % self.every):
      return False
    bad = first_nonfinite(state)
    if bad is not None:
      logging.error("not saving iteration %d: the train state has a NaN or inf in %s", iteration, bad)
      return False
    with _SAVE_STARTS:
      self._manager.save(iteration, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                             host=ocp.args.JsonSave(host_state)), force=force)
    return True

  def wait(self) -> None:
    """Returns once the save in flight (if any) is on disk; a save still in flight when the process exits is lost."""
    self._manager.wait_until_finished()

  def restore_latest(self, abstract_state):
    """(iteration, state, host_state) of the newest checkpoint that restores to a finite state, or None when there
    is no checkpoint; raises RestoreError when there are checkpoints and none restores."""
    self.wait()
    broken: list[tuple[int, str]] = []
    for step in reversed(self.steps()):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), host=ocp.args.JsonRestore()))
        bad = first_nonfinite(restored.state)
        if bad is not None:
          raise ValueError(f"non-finite values in {bad}")
      except Exception as error:  # noqa: BLE001 - any failure means this checkpoint is unusable
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        logging.error("checkpoint %d in %s cannot be restored (%s); trying an older one", step, self.directory,
                      reason)
        broken.append((step, reason))
        continue
      if broken:
        self._set_aside([s for s, _ in broken])
      return step, restored.state, restored.host
    if broken:
      step, reason = broken[0]
      raise RestoreError(f"none of the {len(broken)} checkpoints in {self.directory} restores into this run "
                            f"(newest, {step}: {reason}); resume with the config that wrote them, or start in a "
                            f"new workdir")
    return None

  def _set_aside(self, steps: list[int]) -> None:
    """Renames broken step directories `<step>.broken-<time>` and reloads the manager (process 0 renames)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if jax.process_index() == 0:
      for step in steps:
        target, n = self.directory / f"{step}.broken-{stamp}", 0
        while target.exists():  # the same step set aside twice within a second
          n += 1
          target = self.directory / f"{step}.broken-{stamp}-{n}"
        (self.directory / str(step)).rename(target)
        logging.warning("moved broken checkpoint %d aside to %s", step, target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("ragen_jax checkpoints set aside")
    self._manager.reload()

  def close(self):
    self._manager.close()


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) of a concrete pytree, for restoring into it."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
