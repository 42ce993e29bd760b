"""Training entry point: rollout → score → filter → update, with validation and checkpoints.

  python -m ragen_jax.train --config=configs/NAME.py [--config.x=y ...]

A SIGTERM stops the run after the current iteration with its checkpoint saved, and the process exits with
`preemption.PREEMPTED_EXIT_CODE`; run again, it resumes from that checkpoint.
"""

from __future__ import annotations

import json
import logging
import sys

import jax

from ragen_jax import config as config_lib
from ragen_jax import preemption
from ragen_jax.report.startup import quiet_library_logs
from ragen_jax.report.writer import json_ready
from ragen_jax.trainer import train


def main(config):
  logging.getLogger().setLevel(logging.INFO)
  quiet_library_logs()
  try:
    with preemption.sigterm_requests_stop():
      metrics = train(config)
  except preemption.Preempted:
    sys.exit(preemption.PREEMPTED_EXIT_CODE)
  if jax.process_index() == 0:
    shown = json_ready({k: v for k, v in metrics.items() if "/" in k and not k.startswith("time")})
    print(json.dumps({k: v if v is None else round(v, 4) for k, v in shown.items()}, indent=1))


if __name__ == "__main__":
  config_lib.run(main)
