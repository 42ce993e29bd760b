"""A fake `gs://` for tests, without network: every `gs://BUCKET/...` URL maps to `ROOT/BUCKET/...` on local disk.

The URLs go through the same code as on Cloud TPU: etils.epath's fsspec backend (here a DirFileSystem registered
for the `gs`/`gcs` protocols instead of gcsfs) and Orbax's GCS branch, whose TensorStore kvstore is pointed at the
local folder instead of TensorStore's GCS driver.
"""

from __future__ import annotations

import contextlib
import os
import sys

import fsspec
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils


class _FakeGcsFileSystem(DirFileSystem):
  """gcsfs's paths (`bucket/key`, given with or without `gs://`) under a local root."""

  protocol = ("gs", "gcs")
  root = ""

  def __init__(self, *args, **kwargs):
    kwargs.pop("finalize_on_close", None)
    super().__init__(path=self.root, fs=LocalFileSystem(), **kwargs)

  def _join(self, path):
    if isinstance(path, str):
      path = path.split("://", 1)[-1]
    elif isinstance(path, list):
      path = [p.split("://", 1)[-1] for p in path]
    return super()._join(path)


@contextlib.contextmanager
def fake_gcs(root: str | os.PathLike):
  """Within the block, `gs://` URLs read and write under local folder `root` (Orbax checkpoints included)."""
  os.makedirs(root, exist_ok=True)
  fake = type("FakeGcs", (_FakeGcsFileSystem,), {"root": os.fspath(root)})
  saved_kvstore, saved_hns = gcs_utils.get_kvstore_for_gcs, gcs_utils.is_hierarchical_namespace_enabled
  for protocol in ("gs", "gcs"):
    fsspec.register_implementation(protocol, fake, clobber=True)
  epath_backend.fsspec_backend._get_filesystem.cache_clear()
  fsspec.filesystem("gs").clear_instance_cache()

  def local_kvstore(url: str) -> dict:
    return {"driver": "file", "path": os.path.join(os.fspath(root), url.split("://", 1)[1])}

  gcs_utils.get_kvstore_for_gcs = local_kvstore
  gcs_utils.is_hierarchical_namespace_enabled = lambda path: False
  try:
    yield
  finally:
    gcs_utils.get_kvstore_for_gcs, gcs_utils.is_hierarchical_namespace_enabled = saved_kvstore, saved_hns
    for protocol in ("gs", "gcs"):
      sys.modules["fsspec.registry"]._registry.pop(protocol, None)  # back to fsspec's known (gcsfs) implementation
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
