"""Countdown and math problem sets as tensorflow-datasets builders.

Each builder writes `array_record` files once into a tfds data directory and
is read back with `tfds.data_source` (random access, no TensorFlow needed).
Nothing is downloaded: problems come from reasoning-gym's generators, run
locally, or from a file the user names.

* `RagenCountdown`: reasoning-gym `countdown` (numbers, target, a reference
  solution). Train and validation come from disjoint generator indices;
  validation drops problems that also occur in train.
* `RagenGsmSymbolic`: reasoning-gym `gsm_symbolic` word problems (GSM8K
  templates with fresh numbers).
* `RagenMathFile`: a user's JSON list or JSONL file with a question and a
  worked or bare answer per record (GSM8K `question`/`answer`, MetaMathQA
  `query`/`response`, or `problem`/`solution`); the gold answer is read with
  `math_answers.gold_answer` (a numeric answer is taken as its text; a UTF-8
  byte-order mark is skipped). Validation comes from `validation_path`, or is
  a stable hash-chosen `validation_fraction` of the file. The files are read
  and checked when the env is configured: a broken record (named by
  file:line), an empty file or a split left empty is a ValueError.

`problems(builder, config, split, data_dir)` returns a cached, decoded,
random-access view. The default data directory is `$RAGEN_JAX_CACHE/tfds`,
else `~/.cache/ragen_jax/tfds` (the same cache root as `ragen_jax`). A config
is named after its parameters (or, for files, a digest of path, size and
modification time), so changing either builds a new dataset instead of
reading a stale one.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import tensorflow_datasets as tfds

from envs.host.arithmetic import evaluate, parse_arithmetic
from envs.host.math_answers import gold_answer
from envs.host.records import field, file_digest, in_validation, read_records
from ragen_jax import paths

SPLITS = ("train", "validation")
_QUESTION_KEYS = ("question", "query", "problem")
_ANSWER_KEYS = ("answer", "response", "solution")


def default_data_dir() -> str:
  """Where the generated datasets are prepared: `tfds/` in the host's cache (`paths.default_cache_root`)."""
  return paths.join(paths.default_cache_root(), "tfds")


class _InMemoryBuilder(tfds.core.GeneratorBasedBuilder):
  """A builder whose two splits are computed in memory by `make_splits`."""

  VERSION = tfds.core.Version("1.0.0")
  FEATURES: dict = {"question": tfds.features.Text(), "answer": tfds.features.Text()}

  @abc.abstractmethod
  def make_splits(self) -> tuple[list[dict], list[dict]]:
    """(train records, validation records)."""

  def _info(self) -> tfds.core.DatasetInfo:
    features = tfds.features.FeaturesDict(self.FEATURES)
    return tfds.core.DatasetInfo(builder=self, description=self.__doc__, features=features)

  def _split_generators(self, dl_manager):
    train, validation = self.make_splits()
    return {"train": self._generate_examples(train), "validation": self._generate_examples(validation)}

  def _generate_examples(self, items: list[dict]) -> Iterator[tuple[int, dict]]:
    yield from enumerate(items)


# --------------------------------------------------------------------------- countdown


@dataclasses.dataclass
class CountdownConfig(tfds.core.BuilderConfig):
  """reasoning-gym countdown parameters (defaults: RAGEN-sized 3-4 number puzzles)."""

  train_size: int = 4096
  validation_size: int = 512
  min_numbers: int = 3
  max_numbers: int = 4
  min_value: int = 1
  max_value: int = 99
  min_target: int = 1
  max_target: int = 100
  seed: int = 0


class RagenCountdown(_InMemoryBuilder):
  """Countdown puzzles: reach `target` using each of `numbers` once with + - * /."""

  BUILDER_CONFIGS = [CountdownConfig(name="default")]
  FEATURES = {
    "numbers": tfds.features.Tensor(shape=(None,), dtype=np.int32),
    "target": np.int32,
    "solution": tfds.features.Text(),
  }

  def make_splits(self) -> tuple[list[dict], list[dict]]:
    """Generator indices in order; problems whose reference solution does not
    reach the target with exactly the given numbers are skipped."""
    from reasoning_gym.games.countdown import CountdownConfig as GymConfig, CountdownDataset

    c = self.builder_config
    limit = 2 * (c.train_size + c.validation_size) + 64
    gym = CountdownDataset(
      GymConfig(
        min_numbers=c.min_numbers,
        max_numbers=c.max_numbers,
        min_value=c.min_value,
        max_value=c.max_value,
        min_target=c.min_target,
        max_target=c.max_target,
        seed=c.seed,
        size=limit,
      )
    )
    train, validation, seen = [], [], set()
    for index in range(limit):
      if len(validation) == c.validation_size:
        break
      item = gym[index]["metadata"]
      numbers, target = [int(n) for n in item["numbers"]], int(item["target"])
      solution = parse_arithmetic(item["expression"])
      if solution is None or sorted(solution.numbers) != sorted(numbers) or evaluate(solution) != target:
        continue
      key = (tuple(sorted(numbers)), target)
      if len(train) < c.train_size:
        train.append({"numbers": numbers, "target": target, "solution": item["expression"]})
        seen.add(key)
      elif key not in seen:
        validation.append({"numbers": numbers, "target": target, "solution": item["expression"]})
    if len(validation) < c.validation_size:
      raise RuntimeError(
        f"countdown generator gave too few valid, distinct problems in {limit} tries; widen the ranges"
      )
    return train, validation


# --------------------------------------------------------------------------- math


def _check_problem(question, answer, where: str) -> dict:
  if isinstance(answer, (int, float)) and not isinstance(answer, bool):
    answer = str(answer)  # a numeric gold answer ({"answer": 72}) is kept as its text
  if not isinstance(question, str) or not question.strip() or not isinstance(answer, str) or not answer.strip():
    raise ValueError(f"{where}: question and answer must be non-empty strings (or a number for the answer)")
  return {"question": question.strip(), "answer": gold_answer(answer)}


@dataclasses.dataclass
class GsmSymbolicConfig(tfds.core.BuilderConfig):
  train_size: int = 4096
  validation_size: int = 512
  seed: int = 0


class RagenGsmSymbolic(_InMemoryBuilder):
  """GSM-style word problems from reasoning-gym's gsm_symbolic templates."""

  BUILDER_CONFIGS = [GsmSymbolicConfig(name="default")]

  def make_splits(self) -> tuple[list[dict], list[dict]]:
    import reasoning_gym

    c = self.builder_config
    size = c.train_size + c.validation_size
    gym = reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=c.seed)
    items = [_check_problem(gym[i]["question"], gym[i]["answer"], f"gsm_symbolic[{i}]") for i in range(size)]
    train = items[: c.train_size]
    questions = {p["question"] for p in train}  # validation drops exact repeats of a training question
    return train, [p for p in items[c.train_size :] if p["question"] not in questions]


@dataclasses.dataclass
class MathFileConfig(tfds.core.BuilderConfig):
  path: str = ""
  validation_path: str = ""
  validation_fraction: float = 0.1


class RagenMathFile(_InMemoryBuilder):
  """Math problems from a user's JSON/JSONL file (question + answer per record)."""

  BUILDER_CONFIGS = [MathFileConfig(name="unset")]

  def make_splits(self) -> tuple[list[dict], list[dict]]:
    c = self.builder_config
    return math_file_splits(c.name, c.path, c.validation_path, c.validation_fraction)


@functools.lru_cache(maxsize=32)
def math_file_splits(name: str, path: str, validation_path: str, validation_fraction: float
                     ) -> tuple[list[dict], list[dict]]:
  """(train, validation) problems of a `MathFileConfig`'s fields; ValueError naming the file (and line) when
  a record is broken or a split would be empty. Cached per config `name`, which changes with the files."""
  del name  # the cache key only
  if not path:
    raise ValueError("RagenMathFile needs MathFileConfig(path=...)")

  def load(file: str) -> list[dict]:
    items = [
      _check_problem(field(r, _QUESTION_KEYS, place), field(r, _ANSWER_KEYS, place), place)
      for place, r in read_records(file)
    ]
    if not items:
      raise ValueError(f"{file} has no records")
    return items

  if validation_path:
    return load(path), load(validation_path)
  items = load(path)
  held_out = [in_validation(p["question"], validation_fraction) for p in items]
  train, validation = [p for p, v in zip(items, held_out) if not v], [p for p, v in zip(items, held_out) if v]
  if not train or not validation:
    raise ValueError(f"all {len(items)} records of {path} land in the {'validation' if train == [] else 'train'} "
                     f"split with validation_fraction={validation_fraction}; add records, change the "
                     f"fraction or give a validation_path")
  return train, validation


# --------------------------------------------------------------------------- loading


def config_name(config: tfds.core.BuilderConfig) -> str:
  """A tfds config name that spells out the parameters (fields other than tfds's own)."""
  own = {f.name for f in dataclasses.fields(tfds.core.BuilderConfig)}
  values = [f"{f.name}{getattr(config, f.name)}" for f in dataclasses.fields(config) if f.name not in own]
  return "_".join(values).replace(".", "p")


def _plain(value):
  """tfds feature values as plain Python: bytes -> str, numpy -> int / list."""
  if isinstance(value, bytes):
    return value.decode()
  return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value


class Problems(Sequence):
  """Random-access decoded records of one split (bytes become str, arrays lists)."""

  def __init__(self, source):
    self._source = source

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> dict:
    if not -len(self) <= index < len(self):
      raise IndexError(f"problem {index} of {len(self)}")
    record = self._source[index % len(self)]
    return {key: _plain(value) for key, value in record.items()}


_LOADED: dict[tuple[str, str, str, str], Problems] = {}
_LOADING = threading.Lock()


def problems(
  builder: type[tfds.core.GeneratorBasedBuilder], config: tfds.core.BuilderConfig, split: str, data_dir: str
) -> Problems:
  """One split of `builder` under `config`, prepared on first use into `data_dir`
  (cached per process by builder, config name, split and directory)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  key = (builder.name, config.name, split, str(data_dir))
  with _LOADING:
    if key not in _LOADED:
      _LOADED[key] = Problems(
        tfds.data_source(
          builder.name,
          split=split,
          data_dir=data_dir,
          builder_kwargs={"config": config, "file_format": "array_record"},
          download_and_prepare_kwargs={"download_config": tfds.download.DownloadConfig(try_download_gcs=False)},
        )
      )
    return _LOADED[key]


def _named_config(cls: type, params: dict) -> tfds.core.BuilderConfig:
  own = {f.name for f in dataclasses.fields(tfds.core.BuilderConfig)}
  known = sorted(f.name for f in dataclasses.fields(cls) if f.name not in own)
  unknown = sorted(set(params) - set(known))
  if unknown:
    raise ValueError(f"unknown {cls.__name__} option(s) {unknown}; known: {known}")
  bad = {k: v for k, v in params.items() if not isinstance(v, int) or v < 0}
  if bad:
    raise ValueError(f"{cls.__name__} options must be non-negative integers, got {bad}")
  config = cls(name="unnamed", **params)
  config.name = config_name(config)
  return config


def countdown_config(**params) -> CountdownConfig:
  """A CountdownConfig named after its parameters (ValueError on unknown ones)."""
  return _named_config(CountdownConfig, params)


def gsm_symbolic_config(**params) -> GsmSymbolicConfig:
  """A GsmSymbolicConfig named after its parameters (ValueError on unknown ones)."""
  return _named_config(GsmSymbolicConfig, params)


def math_file_config(path: str, validation_path: str = "", validation_fraction: float = 0.1) -> MathFileConfig:
  """A MathFileConfig named after the files' digest; the files are read and checked (`math_file_splits`)."""
  for p in (path, validation_path):
    if p and (not paths.exists(p) or paths.isdir(p)):
      raise FileNotFoundError(f"math problem file not found: {p}")
  if not 0.0 <= validation_fraction < 1.0:
    raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
  name = f"file{file_digest(path, validation_path)}_val{validation_fraction}".replace(".", "p")
  config = MathFileConfig(
    name=name,
    path=paths.join(path),
    validation_path=validation_path and paths.join(validation_path),
    validation_fraction=validation_fraction,
  )
  # read and checked now, once per file version, not at the first reset
  math_file_splits(config.name, config.path, config.validation_path, validation_fraction)
  return config
