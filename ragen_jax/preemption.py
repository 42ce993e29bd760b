"""Preemption: a SIGTERM asks the trainer to checkpoint at the next safe point and exit with PREEMPTED_EXIT_CODE.

`sigterm_requests_stop()` turns SIGTERM into a request the training loop polls with `requested()` after each
iteration; it then saves a checkpoint and raises `Preempted`, which the entry point turns into the exit code. Only
the standard library at import time: the launchers import PREEMPTED_EXIT_CODE without JAX.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: the launchers restart a job that exits with it, resuming from its workdir

_requested = threading.Event()


class Preempted(Exception):
  """A SIGTERM stopped the run after it saved a checkpoint; the entry point exits with PREEMPTED_EXIT_CODE."""


@contextlib.contextmanager
def sigterm_requests_stop() -> Iterator[None]:
  """Within the block, SIGTERM sets the flag `requested()` reads instead of ending the process (main thread only;
  the previous handler is restored after)."""
  _requested.clear()
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: _requested.set())
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def requested() -> bool:
  """Whether a SIGTERM reached this process or, with several processes, any of them (SIGTERM may reach only some
  hosts): then a collective, so every process calls it at the same point of the loop."""
  import jax  # here, not at the top: the launchers import this module without JAX
  if jax.process_count() == 1:
    return _requested.is_set()
  from jax.experimental import multihost_utils
  return bool(multihost_utils.process_allgather(_requested.is_set()).any())
