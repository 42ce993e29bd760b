"""Reading users' problem files (JSON list or JSONL) and splitting them stably."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from ragen_jax import paths


def read_records(path: str) -> list[tuple[str, dict]]:
  """(place, record) for each object of a JSON list or JSONL file (local or `gs://`); place is
  "path:line" or "path[index]". ValueError naming the place on bad input. A UTF-8 byte-order mark is skipped."""
  text = paths.read_bytes(path).decode("utf-8-sig")
  if text.lstrip().startswith("["):
    try:
      items = json.loads(text)
    except json.JSONDecodeError as error:
      raise ValueError(f"{path}: not a JSON list ({error})") from error
    placed = [(f"{path}[{i}]", item) for i, item in enumerate(items)]
  else:
    placed = []
    for number, line in enumerate(text.splitlines(), 1):
      if line.strip():
        try:
          placed.append((f"{path}:{number}", json.loads(line)))
        except json.JSONDecodeError as error:
          raise ValueError(f"{path}:{number}: not JSON ({error})") from error
  for place, record in placed:
    if not isinstance(record, dict):
      raise ValueError(f"{place}: each record must be a JSON object, got {type(record).__name__}")
  return placed


def field(record: dict, keys: Sequence[str], place: str):
  """The value of the first of `keys` that `record` has."""
  for key in keys:
    if key in record:
      return record[key]
  raise ValueError(f"{place}: needs one of the keys {list(keys)}; has {sorted(record)}")


def in_validation(key: str, fraction: float) -> bool:
  """Stable hash split: the same key lands in the same split on every machine."""
  digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
  return digest < fraction * 2**64


def hash_split(items, key, fraction: float, source: str, instead: str) -> dict[str, tuple]:
  """{"train", "validation"}: `items` split by `in_validation(key(item), fraction)`; ValueError when a split is
  empty, naming `source` and the option (`instead`) that gives the validation split its own file."""
  held_out = [in_validation(key(item), fraction) for item in items]
  splits = {"train": tuple(i for i, v in zip(items, held_out) if not v),
            "validation": tuple(i for i, v in zip(items, held_out) if v)}
  empty = [name for name, part in splits.items() if not part]
  if empty:
    raise ValueError(f"the {empty[0]} split of {source} is empty with validation_fraction={fraction}; add "
                     f"records, change the fraction or give {instead}")
  return splits


def existing_file(path: str, what: str) -> str:
  """`path` normalised by the path layer; FileNotFoundError "<what> not found" when it is not a file."""
  if not paths.exists(path) or paths.isdir(path):
    raise FileNotFoundError(f"{what} not found: {path}")
  return paths.join(path)


def write_jsonl(path: str, records) -> None:
  """`records` as JSONL at `path` (local or `gs://`)."""
  paths.write_text(path, "".join(json.dumps(record) + "\n" for record in records))


def file_digest(*names: str) -> str:
  """Digest of paths, sizes and modification times (changes when a file does)."""
  parts = [paths.fingerprint(path) for path in names if path]
  return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
