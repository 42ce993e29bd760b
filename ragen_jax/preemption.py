"""Preemption: a SIGTERM asks the trainer to checkpoint at the next safe point and exit with PREEMPTED_EXIT_CODE."""

from __future__ import annotations

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: the launchers restart a job that exits with it, resuming from its workdir
