"""The one path layer for the files of a run: local paths and `gs://` URLs alike, through etils.epath.

Every file a run reads or writes (metrics, TensorBoard events, checkpoints, the config copy, reports, plots, the
HF export, evaluation results, datasets, the user's JSONL) is named by a string that may be a local path or a
`gs://bucket/...` URL; this module is the only place that joins, reads, writes or lists them. Orbax takes such a
URL itself. Cloud object stores cannot append or rename in place, so appends rewrite the object, and tools that
insist on a local directory (safetensors, tokenizers, matplotlib, the profiler) write into `writing_dir`, which
uploads on exit. A model directory on `gs://` is staged to a local cache once per host (`staged`).

`gs://` needs gcsfs at run time (pinned in launch/requirements-*.txt); tests use tests/fake_gcs.py instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator

from etils import epath

STAGED_MARKER = ".ragen_jax_staged"  # written last into a staged directory: its presence means complete


def is_remote(path: str | os.PathLike) -> bool:
  """Whether `path` is a URL (`gs://...` and other `scheme://`), not a local path."""
  return "://" in os.fspath(path)


def path(name: str | os.PathLike) -> epath.Path:
  """`name` as an epath.Path: URLs as given, local paths absolute with `~` expanded."""
  name = os.fspath(name)
  if is_remote(name):
    return epath.Path(name)
  return epath.Path(os.path.abspath(os.path.expanduser(name)))


def join(base: str | os.PathLike, *parts: str) -> str:
  """`base/part/...` as a string, for local paths and URLs alike."""
  return os.fspath(path(base).joinpath(*parts))


def parent(name: str | os.PathLike) -> str:
  """The directory that holds `name`."""
  return os.fspath(path(name).parent)


def exists(name: str | os.PathLike) -> bool:
  return path(name).exists()


def isdir(name: str | os.PathLike) -> bool:
  return path(name).is_dir()


def listdir(name: str | os.PathLike) -> list[str]:
  """The names (not paths) in directory `name`, sorted."""
  return sorted(p.name for p in path(name).iterdir())


def fingerprint(name: str | os.PathLike) -> str:
  """`name`, its size and modification time: changes when the file does."""
  info = path(name).stat()
  return f"{path(name)}:{info.length}:{info.mtime}"


def makedirs(name: str | os.PathLike) -> None:
  path(name).mkdir(parents=True, exist_ok=True)


def remove_tree(name: str | os.PathLike) -> None:
  """Deletes the directory `name` and everything under it, or the file `name` (nothing when it does not exist)."""
  target = path(name)
  if target.is_dir():
    target.rmtree()
  elif target.exists():
    target.unlink()


def read_text(name: str | os.PathLike) -> str:
  return path(name).read_text(encoding="utf-8")


def read_bytes(name: str | os.PathLike) -> bytes:
  return path(name).read_bytes()


def write_bytes(name: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `name` whole, creating its directory: atomically on a local disk (a temporary file renamed
  over it), and as one object upload on a cloud store."""
  target = path(name)
  target.parent.mkdir(parents=True, exist_ok=True)
  if is_remote(name):
    target.write_bytes(data)
    return
  fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=os.fspath(target.parent))
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, os.fspath(target))
  except BaseException:
    os.unlink(tmp)
    raise


def write_text(name: str | os.PathLike, text: str) -> None:
  """`write_bytes` of `text` in UTF-8."""
  write_bytes(name, text.encode("utf-8"))


def append_lines(name: str | os.PathLike, lines: Iterable[str]) -> None:
  """Appends `lines` (each ending in a newline) to `name`. A cloud object cannot grow in place: it is read and
  written again whole, which is fine for the small JSONL files of a run."""
  data = "".join(lines).encode("utf-8")
  if not data:
    return
  if is_remote(name):
    old = read_bytes(name) if exists(name) else b""
    write_bytes(name, old + data)
    return
  makedirs(parent(name))
  with open(os.fspath(path(name)), "ab") as f:
    f.write(data)


def copy_tree(source: str | os.PathLike, destination: str | os.PathLike, only: Iterable[str] | None = None) -> None:
  """Copies the files under directory `source` into `destination` (either may be remote), keeping the layout;
  `only`: just these names at the top level (those that exist)."""
  source, destination = path(source), path(destination)
  destination.mkdir(parents=True, exist_ok=True)
  for entry in sorted(source.iterdir()):  # no recursive glob: epath refuses `**` on cloud stores
    if only is not None and entry.name not in only:
      continue
    if entry.is_dir():
      copy_tree(entry, destination / entry.name)
    else:
      (destination / entry.name).write_bytes(entry.read_bytes())


@contextlib.contextmanager
def writing_dir(name: str | os.PathLike) -> Iterator[str]:
  """A local directory to write `name`'s files into: `name` itself when local (created), else a temporary
  directory whose files are uploaded to `name` when the block ends without an error."""
  if not is_remote(name):
    makedirs(name)
    yield os.fspath(path(name))
    return
  with tempfile.TemporaryDirectory(prefix="ragen_jax-upload-") as local:
    yield local
    copy_tree(local, name)


def default_cache_root() -> str:
  """`$RAGEN_JAX_CACHE`, else `~/.cache/ragen_jax`: where models are converted and staged on this host."""
  return os.environ.get("RAGEN_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ragen_jax")


def staged(name: str | os.PathLike, cache_root: str | None = None, only: tuple[str, ...] | None = None) -> str:
  """A local directory with the files of directory `name` (`only`: just these top-level names): `name` itself when
  local; for a URL, a copy in `cache_root/staged/` made once per host. The copy is written beside its target and
  renamed into place with a marker file, so an interrupted copy is never used, a complete one is never copied
  again, and processes that start together on one host copy once (the others wait on a lock)."""
  if not is_remote(name):
    return os.fspath(name)
  url = os.fspath(name).rstrip("/")
  root = os.path.join(cache_root or default_cache_root(), "staged")
  digest = hashlib.sha256(repr((url, only)).encode()).hexdigest()[:12]
  target = os.path.join(root, f"{os.path.basename(url)}-{digest}")
  marker = os.path.join(target, STAGED_MARKER)
  os.makedirs(root, exist_ok=True)
  with open(target + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this process dies
    if os.path.exists(marker):
      return target
    if not isdir(url):
      raise FileNotFoundError(f"{url} is not a directory (or cannot be read with these credentials)")
    logging.info("staging %s to %s", url, target)
    partial = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.partial-", dir=root)
    try:
      copy_tree(url, partial, only)
      with open(os.path.join(partial, STAGED_MARKER), "w") as f:
        f.write(url + "\n")
      shutil.rmtree(target, ignore_errors=True)  # an earlier copy without its marker
      os.rename(partial, target)
    except BaseException:
      shutil.rmtree(partial, ignore_errors=True)
      raise
  return target
