"""Checkpoints never go backwards: a non-finite state is never saved or restored, so rotation keeps the newest
finite checkpoint, a broken newest checkpoint is set aside so the next saves happen, and a process killed during an
(async) save leaves the previous checkpoint the newest."""

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import threading

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint._src.path import atomicity

from ragen_jax.checkpoint import Checkpointer, abstract_like

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STATE = {"w": jnp.arange(4.0), "count": jnp.zeros((), jnp.int32)}
NAN_STATE = {"w": jnp.array([0.0, jnp.nan, 2.0, 3.0]), "count": jnp.zeros((), jnp.int32)}


def test_non_finite_states_are_never_saved_and_rotation_keeps_the_newest_finite(tmp_path):
  checkpointer = Checkpointer(str(tmp_path), every=1, max_to_keep=2)
  assert checkpointer.maybe_save(1, STATE, {"iteration": 1}) and checkpointer.maybe_save(2, STATE, {"iteration": 2})
  for iteration in (3, 4, 5):  # rotation would have dropped 1, 2 and 3 by now
    assert not checkpointer.maybe_save(iteration, NAN_STATE, {"iteration": iteration}, force=True)
  assert checkpointer.steps() == [1, 2]
  checkpointer.close()


def test_runs_in_two_threads_checkpoint_side_by_side(tmp_path):
  """Two checkpointers saving from two threads at once (as the demo's environments do); started unserialised,
  Orbax's process-wide save ids mix and a save fails within the first few."""
  def run(name):
    checkpointer = Checkpointer(str(tmp_path / name), every=1, max_to_keep=2)
    state = {"w": jnp.arange(1000.0) + len(name), "count": jnp.zeros((), jnp.int32)}
    for iteration in range(1, 11):
      checkpointer.maybe_save(iteration, state, {"iteration": iteration})
    restored = checkpointer.restore_latest(abstract_like(state))
    checkpointer.close()
    return restored[0], restored[2], np.asarray(restored[1]["w"])

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    futures = {name: pool.submit(run, name) for name in ("a", "bb")}
  for name, future in futures.items():
    step, host, w = future.result()
    assert (step, host) == (10, {"iteration": 10})
    np.testing.assert_array_equal(w, np.arange(1000.0) + len(name))


def test_a_non_finite_checkpoint_on_disk_counts_as_broken_and_is_set_aside(tmp_path):
  checkpointer = Checkpointer(str(tmp_path), every=1, max_to_keep=3)
  checkpointer.maybe_save(1, STATE, {"iteration": 1})
  checkpointer.close()
  # a NaN state written by a plain Orbax manager (as an earlier version of the trainer could)
  with ocp.CheckpointManager(str(tmp_path), options=ocp.CheckpointManagerOptions(create=True)) as manager:
    manager.save(2, args=ocp.args.Composite(state=ocp.args.StandardSave(NAN_STATE),
                                            host=ocp.args.JsonSave({"iteration": 2})))
    manager.wait_until_finished()
  checkpointer = Checkpointer(str(tmp_path), every=1, max_to_keep=3)
  step, state, host = checkpointer.restore_latest(abstract_like(STATE))
  assert (step, host) == (1, {"iteration": 1})
  np.testing.assert_array_equal(state["w"], STATE["w"])
  assert checkpointer.steps() == [1] and [p.name.split(".")[0] for p in tmp_path.glob("*.broken-*")] == ["2"]
  assert checkpointer.maybe_save(2, STATE, {"iteration": 2}) and checkpointer.steps() == [1, 2]  # 2 saves again
  checkpointer.close()


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint_usable(tmp_path):
  """The worker (this module, run as a script) saves iteration 1, then is killed with SIGKILL while its async save
  of iteration 2 is in flight, held just before Orbax renames the finished files into place."""
  worker = subprocess.Popen([sys.executable, "-m", "tests.test_checkpoint", str(tmp_path)], cwd=ROOT,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.PIPE, text=True)
  try:
    assert worker.stdout.readline() == "saving 2\n"
  finally:
    worker.kill()
    worker.wait()
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith("2.")]  # the half-made save of iteration 2
  checkpointer = Checkpointer(str(tmp_path), every=1, max_to_keep=3)
  assert checkpointer.steps() == [1]
  step, state, host = checkpointer.restore_latest(abstract_like(STATE))
  assert (step, host) == (1, {"iteration": 1})
  np.testing.assert_array_equal(state["w"], STATE["w"])
  assert checkpointer.maybe_save(2, STATE, {"iteration": 2})
  checkpointer.close()
  assert checkpointer.steps() == [1, 2] and sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]  # no leftover


def _save_and_hang(directory):
  checkpointer = Checkpointer(directory, every=1, max_to_keep=3)
  checkpointer.maybe_save(1, STATE, {"iteration": 1})
  checkpointer.close()  # saved
  checkpointer = Checkpointer(directory, every=1, max_to_keep=3)
  hang = threading.Event()

  async def finalize(self):
    print("saving 2", flush=True)
    await asyncio.to_thread(hang.wait)

  atomicity.AtomicRenameTemporaryPath.finalize = finalize
  checkpointer.maybe_save(2, STATE, {"iteration": 2})
  checkpointer.close()  # waits for the save that never finishes


if __name__ == "__main__":
  _save_and_hang(sys.argv[1])
