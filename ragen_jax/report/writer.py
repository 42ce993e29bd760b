"""Metric writers: JSON lines (for reports), TensorBoard event files, optional W&B."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping

from ragen_jax.report.transcripts import transcript_text, write_jsonl


class MetricWriter:
  """Writes scalar metrics per iteration to `workdir/metrics.jsonl`, TensorBoard and W&B, and transcripts of
  episodes to `workdir/transcripts.jsonl` and TensorBoard.

  Only process 0 writes; other processes get a writer that does nothing.
  """

  def __init__(self, workdir: str, tensorboard: bool = True, wandb_project: str | None = None, config=None,
               enabled: bool = True):
    self.enabled = enabled
    self._tb = self._wandb = self._jsonl = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
    self._transcripts_path = os.path.join(workdir, "transcripts.jsonl")
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
    if wandb_project:
      try:
        import wandb
      except ImportError:
        print("logging.wandb is on but wandb is not installed; skipping W&B")
      else:
        self._wandb = wandb.init(project=wandb_project, dir=workdir, config=config)

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for name, value in clean.items():
        self._tb.add_scalar(name, value, step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(clean, step=step)

  def write_transcripts(self, step: int, records: list[dict]) -> None:
    """Appends decoded episodes (`report.transcripts`) to `workdir/transcripts.jsonl` with the step, and writes
    each to TensorBoard's text tab as `transcripts/<index>`."""
    if not self.enabled or not records:
      return
    write_jsonl(self._transcripts_path, [{"step": step, **record} for record in records])
    if self._tb is not None:
      for index, record in enumerate(records):  # indented: a markdown code block, shown verbatim
        self._tb.add_text(f"transcripts/{index}", "    " + transcript_text(record).replace("\n", "\n    "), step)
      self._tb.flush()

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()


def read_metrics(workdir: str) -> list[dict]:
  """The rows of `workdir/metrics.jsonl`; a later row for the same step replaces an earlier one."""
  rows: dict[int, dict] = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
  return [rows[s] for s in sorted(rows)]
