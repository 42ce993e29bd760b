"""Metric writers: JSON lines (for reports), TensorBoard event files, optional W&B.

The JSON files are strict JSON: a NaN or ±inf metric is written as null (and to TensorBoard and W&B as the float
it is), never dropped, so a diverging run shows where it diverged.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping

from ragen_jax.report.transcripts import transcript_text

METRICS_FILE = "metrics.jsonl"
TRANSCRIPTS_FILE = "transcripts.jsonl"


def json_ready(metrics: Mapping[str, float]) -> dict[str, float | None]:
  """`metrics` as floats, with None (JSON null) in place of NaN and ±inf."""
  values = {k: float(v) for k, v in metrics.items() if v is not None}
  return {k: v if math.isfinite(v) else None for k, v in values.items()}


def dump_json(data, path: str) -> None:
  """Writes `data` to `path` as strict JSON (NaN or inf in it raise rather than write invalid JSON)."""
  with open(path, "w") as f:
    json.dump(data, f, indent=2, allow_nan=False)


def write_jsonl(path: str, records, mode: str = "a") -> None:
  """Writes each record as one line of strict JSON, appending by default."""
  with open(path, mode) as f:
    for record in records:
      f.write(json.dumps(record, allow_nan=False) + "\n")


class MetricWriter:
  """Writes scalar metrics per iteration to `workdir/metrics.jsonl`, TensorBoard and W&B, and transcripts of
  episodes to `workdir/transcripts.jsonl` and TensorBoard.

  `start_step`: the iteration the run starts after (0 fresh, k when resumed from iteration k). Rows of later
  iterations, left by an interrupted run that is now redoing them, are dropped from the JSONL files and purged
  from TensorBoard, so no iteration is logged twice. Only process 0 writes; other processes get a writer that does
  nothing.
  """

  def __init__(self, workdir: str, tensorboard: bool = True, wandb_project: str | None = None, config=None,
               enabled: bool = True, start_step: int = 0):
    self.enabled = enabled
    self._tb = self._wandb = self._jsonl = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, METRICS_FILE)
    self._transcripts_path = os.path.join(workdir, TRANSCRIPTS_FILE)
    for jsonl in (path, self._transcripts_path):
      _drop_rows_after(jsonl, start_step)
    self._jsonl = open(path, "a")
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=start_step + 1)
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
    values = {k: float(v) for k, v in metrics.items() if v is not None}
    self._jsonl.write(json.dumps({"step": step, **json_ready(values)}, allow_nan=False) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for name, value in values.items():
        self._tb.add_scalar(name, value, step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(values, step=step)

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


def _drop_rows_after(path: str, step: int) -> None:
  """Rewrites the JSONL file at `path` without its rows of iterations after `step` (atomically)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = [line for line in lines if json.loads(line)["step"] <= step]
  if len(kept) == len(lines):
    return
  with open(path + ".tmp", "w") as f:
    f.writelines(kept)
  os.replace(path + ".tmp", path)


def read_metrics(workdir: str) -> list[dict]:
  """The rows of `workdir/metrics.jsonl`; a later row for the same step replaces an earlier one. A non-finite
  value reads as None."""
  rows: dict[int, dict] = {}
  with open(os.path.join(workdir, METRICS_FILE)) as f:
    for line in f:
      if line.strip():
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
  return [rows[s] for s in sorted(rows)]
