"""The path layer: local paths and `gs://` alike (a fake bucket on local disk), model staging, and a whole training
run with its model and workdir on the bucket, resumed once, that equals the same run on local disk."""

import ast
import json
import multiprocessing
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from ragen_jax import paths
from ragen_jax.report.writer import read_metrics
from ragen_jax.trainer import train
from tests.fake_gcs import fake_gcs
from tests.test_layout import ROOT
from tests.test_train import _config, tensorboard_texts

# Modules that name run files; they reach them through ragen_jax.paths only.
RUN_FILE_MODULES = ["ragen_jax/trainer.py", "ragen_jax/checkpoint.py", "ragen_jax/evaluate.py", "ragen_jax/plan.py",
                    "ragen_jax/report/writer.py", "ragen_jax/report/summary.py", "ragen_jax/report/comparison.py",
                    "ragen_jax/report/startup.py", "ragen_jax/demo/__main__.py", "ragen_jax/demo/compare.py",
                    "ragen_jax/demo/stages.py", "ragen_jax/models/lora.py", "envs/host/records.py"]


@pytest.fixture
def bucket(tmp_path):
  """The local folder behind `gs://`: `gs://b/x` is `bucket / "b" / "x"`."""
  with fake_gcs(tmp_path / "gcs"):
    yield tmp_path / "gcs"


@pytest.mark.parametrize("remote", [False, True])
def test_files_read_write_append_list_and_copy_alike_on_disk_and_on_the_bucket(tmp_path, bucket, remote):
  base = "gs://b/run" if remote else str(tmp_path / "run")
  on_disk = bucket / "b" / "run" if remote else tmp_path / "run"
  paths.write_text(paths.join(base, "sub", "a.txt"), "first")
  paths.write_text(paths.join(base, "sub", "a.txt"), "second")  # replaced whole
  paths.append_lines(paths.join(base, "m.jsonl"), ["1\n"])
  paths.append_lines(paths.join(base, "m.jsonl"), ["2\n", "3\n"])
  assert (on_disk / "sub" / "a.txt").read_text() == "second"
  assert paths.read_text(paths.join(base, "m.jsonl")) == "1\n2\n3\n"
  assert paths.listdir(base) == ["m.jsonl", "sub"] and paths.isdir(paths.join(base, "sub"))
  assert paths.parent(paths.join(base, "sub")) == base
  with paths.writing_dir(paths.join(base, "export")) as local:
    with open(os.path.join(local, "w.bin"), "wb") as f:  # a tool that wants a local directory
      f.write(b"\x00\x01")
  assert (on_disk / "export" / "w.bin").read_bytes() == b"\x00\x01"
  paths.copy_tree(base, tmp_path / "copy")
  assert (tmp_path / "copy" / "sub" / "a.txt").read_text() == "second"
  assert paths.fingerprint(paths.join(base, "m.jsonl")) != paths.fingerprint(paths.join(base, "sub", "a.txt"))
  paths.remove_tree(base)
  assert not paths.exists(base) and not on_disk.exists()
  assert not (tmp_path / "gs:").exists() and not os.path.exists(os.path.join(ROOT, "gs:"))


def _stage(url, cache, gcs_root):
  with fake_gcs(gcs_root):
    return paths.staged(url, cache)


def test_a_bucket_directory_is_staged_once_per_host_and_never_half(tmp_path, bucket, monkeypatch):
  for name, text in (("config.json", "{}"), ("weights/shard.bin", "w" * 1000)):
    paths.write_text(f"gs://b/model/{name}", text)
  cache = str(tmp_path / "cache")
  copy_tree = paths.copy_tree

  def interrupted(source, destination, only=None):
    copy_tree(source, destination, only)
    raise KeyboardInterrupt  # after writing everything, before it is marked complete

  monkeypatch.setattr(paths, "copy_tree", interrupted)
  with pytest.raises(KeyboardInterrupt):
    paths.staged("gs://b/model", cache)
  left = [n for n in os.listdir(os.path.join(cache, "staged")) if not n.endswith(".lock")]
  assert not left, f"an interrupted copy is left: {left}"
  monkeypatch.undo()
  # two processes that start together copy once: the second finds the first's complete copy
  with multiprocessing.get_context("spawn").Pool(2) as pool:
    local = pool.starmap(_stage, [("gs://b/model/", cache, str(bucket))] * 2)
  assert local[0] == local[1] and open(os.path.join(local[0], "weights", "shard.bin")).read() == "w" * 1000
  marker = os.path.join(local[0], paths.STAGED_MARKER)
  stamp = os.stat(marker).st_mtime_ns
  paths.write_text("gs://b/model/config.json", '{"changed": 1}')
  assert paths.staged("gs://b/model", cache) == local[0] and os.stat(marker).st_mtime_ns == stamp  # not again
  only = paths.staged("gs://b/model", cache, only=("config.json",))
  assert only != local[0] and sorted(os.listdir(only)) == sorted(["config.json", paths.STAGED_MARKER])
  assert paths.staged(str(tmp_path), cache) == str(tmp_path)  # local directories are used in place
  with pytest.raises(FileNotFoundError, match="gs://b/nothing is not a directory"):
    paths.staged("gs://b/nothing", cache)


def test_a_run_on_the_bucket_resumes_and_equals_the_same_run_on_local_disk(replying_model_dir, tmp_path, bucket,
                                                                            monkeypatch):
  monkeypatch.setenv("RAGEN_JAX_CACHE", str(tmp_path / "host_cache"))
  paths.copy_tree(replying_model_dir, "gs://b/models/replying")
  overrides = {"train.val_every": 1, "train.val_transcripts": 2}  # runs of 1 and of 2 iterations validate alike
  remote = "gs://b/runs/x"
  for iterations in (1, 2):  # stopped after 1, then run to 2: resumed from the checkpoint of 1
    train(_config("gs://b/models/replying", remote, **overrides, **{"train.iterations": iterations}))
  train(_config(replying_model_dir, tmp_path / "local", **overrides, **{"train.iterations": 2}))
  run = bucket / "b" / "runs" / "x"
  assert [r["step"] for r in read_metrics(remote)] == [1, 2]
  local_rows = read_metrics(str(tmp_path / "local"))
  for a, b in zip(read_metrics(remote), local_rows):
    assert {k: v for k, v in a.items() if not k.startswith("time/")} == {
        k: v for k, v in b.items() if not k.startswith("time/")}
  assert tensorboard_texts(run) == tensorboard_texts(tmp_path / "local")
  for name in ("parameters.txt", "report.md", "report.png", "final_metrics.json", "final_model/config.json",
               "final_model/tokenizer_config.json", "transcripts.jsonl"):
    assert (run / name).is_file(), name
  assert sorted(os.listdir(run / "checkpoints"), key=int) == ["1", "2"]
  assert json.loads((run / "final_metrics.json").read_text())["train/success"] == local_rows[-1]["train/success"]
  remote_weights = load_file(str(run / "final_model" / "model.safetensors"))
  local_weights = load_file(str(tmp_path / "local" / "final_model" / "model.safetensors"))
  for name, value in local_weights.items():
    np.testing.assert_array_equal(remote_weights[name], value, err_msg=name)
  staged = os.listdir(tmp_path / "host_cache" / "staged")
  assert [n for n in staged if n.startswith("replying-") and not n.endswith(".lock")], staged
  assert not os.path.exists(os.path.join(ROOT, "gs:")) and not os.path.exists("gs:"), "a local folder named gs:"


def test_run_file_modules_use_the_path_layer():
  for module in RUN_FILE_MODULES:
    tree = ast.parse(open(os.path.join(ROOT, module)).read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        assert name not in ("open", "os.path.join", "os.makedirs", "os.path.exists", "os.path.isdir",
                            "shutil.rmtree", "Path", "pathlib.Path"), f"{module}:{node.lineno} calls {name}"
