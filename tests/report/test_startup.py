"""Start-up summary: the bundled model is named as such, and library INFO chatter is turned down."""

import logging

from absl import logging as absl_logging

from ragen_jax.report import startup
from ragen_jax.report.startup import QUIET_LOGGERS, model_source, quiet_library_logs


def test_model_source_says_when_it_is_the_bundled_model(monkeypatch):
  monkeypatch.setattr(startup, "bundled_model_dir", lambda: "/cache/smollm2")  # no conversion in a test
  assert model_source("") == "the bundled SmolLM2-135M-Instruct (/cache/smollm2)"
  assert model_source("runs/a/final_model") == "runs/a/final_model"


def test_orbax_and_absl_info_lines_are_dropped_and_ours_kept(caplog):
  levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
  try:
    for name in QUIET_LOGGERS:
      logging.getLogger(name).setLevel(logging.NOTSET)
    caplog.set_level(logging.INFO)
    quiet_library_logs()
    absl_logging.info("Saving checkpoint at step 3")  # how Orbax logs
    logging.getLogger("orbax.checkpoint._src.metadata").info("sharding metadata")
    logging.getLogger("ragen_jax.trainer").info("compiling")
    absl_logging.warning("a real problem")
    assert [r.getMessage() for r in caplog.records] == ["compiling", "a real problem"]
  finally:
    for name, level in levels.items():
      logging.getLogger(name).setLevel(level)
