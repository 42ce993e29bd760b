"""Metric writers: JSON lines (for reports), TensorBoard event files, optional W&B.

The JSON files are strict JSON: a NaN or ±inf metric is written as null (and to TensorBoard and W&B as the float
it is), never dropped, so a diverging run shows where it diverged. Every file goes through `ragen_jax.paths`, so a
`gs://` workdir works like a local one; TensorBoard event files on a cloud store are written whole on each flush
(`_WholeFileEvents`).
"""

from __future__ import annotations

import io
import json
import math
import secrets
from collections.abc import Mapping

from ragen_jax import paths
from ragen_jax.report.transcripts import transcript_text

METRICS_FILE = "metrics.jsonl"
TRANSCRIPTS_FILE = "transcripts.jsonl"
CONFIG_FILE = "config.json"  # the run's resolved config
WANDB_ID_FILE = "wandb_id.txt"  # the W&B run id, kept so a resumed run continues the same W&B run
HPARAMS_METRICS = ("train/success", "train/score", "val/success")  # TensorBoard's HParams tab shows these


def json_ready(metrics: Mapping[str, float]) -> dict[str, float | None]:
  """`metrics` as floats, with None (JSON null) in place of NaN and ±inf."""
  values = {k: float(v) for k, v in metrics.items() if v is not None}
  return {k: v if math.isfinite(v) else None for k, v in values.items()}


def dump_json(data, path: str) -> None:
  """Writes `data` to `path` as strict JSON (NaN or inf in it raise rather than write invalid JSON)."""
  paths.write_text(path, json.dumps(data, indent=2, allow_nan=False))


def write_jsonl(path: str, records, mode: str = "a") -> None:
  """Writes each record as one line of strict JSON to `path`, appending by default (`mode="w"` replaces it)."""
  lines = [json.dumps(record, allow_nan=False) + "\n" for record in records]
  if mode == "w":
    paths.write_text(path, "".join(lines))
  else:
    paths.append_lines(path, lines)


class _WholeFileEvents:
  """A TensorBoard event file on a cloud store, which cannot append: kept in memory and uploaded whole on each
  flush (tensorboardX's own `gs://` writer needs google-cloud-storage; this one goes through `ragen_jax.paths`)."""

  def __init__(self, path: str):
    self.path, self.buffer = path, io.BytesIO()

  def write(self, data: bytes) -> None:
    self.buffer.write(data)

  def flush(self) -> None:
    paths.write_bytes(self.path, self.buffer.getvalue())

  def close(self) -> None:
    self.flush()


class _WholeFileEventsFactory:
  def open(self, path: str) -> _WholeFileEvents:
    return _WholeFileEvents(path)

  def directory_check(self, path: str) -> None:  # object stores have no directories to create
    pass


def _tensorboard_writer(logdir: str, start_step: int):
  """tensorboardX's SummaryWriter for `logdir`, with `gs://` going through `_WholeFileEvents`. tensorboardX is
  imported here, when TensorBoard logging is on: importing it imports torch where torch is installed (seconds)."""
  from tensorboardX import SummaryWriter, record_writer
  record_writer.register_writer_factory("gs", _WholeFileEventsFactory())
  # files are named by the second: one per start step keeps a writer restarted within it from truncating the
  # previous one's file, and sorts them in the order TensorBoard must read them
  return SummaryWriter(logdir, purge_step=start_step + 1, filename_suffix=f".{start_step:08d}")


class MetricWriter:
  """Writes scalar metrics per iteration to `workdir/metrics.jsonl`, TensorBoard and W&B, and transcripts of
  episodes to `workdir/transcripts.jsonl` and TensorBoard.

  `start_step`: the iteration the run starts after (0 fresh, k when resumed from iteration k). Rows of later
  iterations, left by an interrupted run that is now redoing them, are dropped from the JSONL files and purged
  from TensorBoard, so no iteration is logged twice. A `config` (the run's resolved config as a dict) is written
  to `workdir/config.json`, logged as TensorBoard hparams and given to W&B, whose run keeps one id per workdir
  (`wandb_run_id`). Only process 0 writes; other processes get a writer that does nothing.
  """

  def __init__(self, workdir: str, tensorboard: bool = True, wandb_project: str | None = None, config=None,
               enabled: bool = True, start_step: int = 0):
    self.enabled = enabled
    self._tb = self._wandb = None
    if not enabled:
      return
    paths.makedirs(workdir)
    self._metrics_path = paths.join(workdir, METRICS_FILE)
    self._transcripts_path = paths.join(workdir, TRANSCRIPTS_FILE)
    for jsonl in (self._metrics_path, self._transcripts_path):
      _drop_rows_after(jsonl, start_step)
    if tensorboard:
      self._tb = _tensorboard_writer(paths.join(workdir, "tensorboard"), start_step)
    if config is not None:
      dump_json(config, paths.join(workdir, CONFIG_FILE))
      if self._tb is not None:
        from tensorboardX.summary import hparams
        experiment, session, _ = hparams(_flat(config), dict.fromkeys(HPARAMS_METRICS, 0.0))
        for summary in (experiment, session):
          self._tb.file_writer.add_summary(summary)
    if wandb_project:
      try:
        import wandb
      except ImportError:
        print("logging.wandb is on but wandb is not installed; skipping W&B")
      else:
        self._wandb = wandb.init(project=wandb_project, dir=None if paths.is_remote(workdir) else workdir,
                                 config=config, id=wandb_run_id(workdir), resume="allow")  # W&B keeps a local dir

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    values = {k: float(v) for k, v in metrics.items() if v is not None}
    write_jsonl(self._metrics_path, [{"step": step, **json_ready(values)}])
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
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      self._wandb.finish()


def wandb_run_id(workdir: str) -> str:
  """The W&B run id of the run in `workdir`: made up and kept in `workdir/wandb_id.txt` the first time."""
  path = paths.join(workdir, WANDB_ID_FILE)
  if not paths.exists(path):
    paths.write_text(path, secrets.token_hex(8))
  return paths.read_text(path).strip()


def _flat(config: Mapping, prefix: str = "") -> dict:
  """A nested config dict as {"section.key": value}, with values other than a bool, number, string or None as
  text (what TensorBoard's hparams can show)."""
  flat = {}
  for key, value in config.items():
    if isinstance(value, Mapping):
      flat |= _flat(value, f"{prefix}{key}.")
    else:
      flat[prefix + key] = value if isinstance(value, (bool, int, float, str)) or value is None else str(value)
  return flat


def _drop_rows_after(path: str, step: int) -> None:
  """Rewrites the JSONL file at `path` without its rows of iterations after `step` (atomically)."""
  if not paths.exists(path):
    return
  lines = [line + "\n" for line in paths.read_text(path).splitlines() if line.strip()]
  kept = [line for line in lines if json.loads(line)["step"] <= step]
  if len(kept) < len(lines):
    paths.write_text(path, "".join(kept))


def read_metrics(workdir: str) -> list[dict]:
  """The rows of `workdir/metrics.jsonl`; a later row for the same step replaces an earlier one. A non-finite
  value reads as None."""
  rows: dict[int, dict] = {}
  for line in paths.read_text(paths.join(workdir, METRICS_FILE)).splitlines():
    if line.strip():
      row = json.loads(line)
      rows.setdefault(row["step"], {}).update(row)
  return [rows[s] for s in sorted(rows)]
