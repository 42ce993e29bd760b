"""`python -m ragen_jax.study [--config=configs/study.py] [--config.study.names=filter,correlation]`.

One warm start per environment shared by every run, then the selected sub-studies (`ragen_jax.study.studies`);
each writes `results.json`, `report.md` and PNGs under `<workdir>/<study>/` and resumes where it stopped.
"""

from __future__ import annotations

import logging

from ragen_jax import config as config_lib
from ragen_jax.demo.stages import share_compiled_programs
from ragen_jax.study.runner import run_study


def main(config):
  logging.getLogger().setLevel(logging.WARNING)
  share_compiled_programs(config)
  run_study(config)


if __name__ == "__main__":
  config_lib.run(main, default_config="configs/study.py")
