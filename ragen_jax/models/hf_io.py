"""Hugging Face checkpoint import/export (config.json + safetensors, single or sharded).

Import reads each tensor lazily (memory-mapped slices) straight into its target
sharding: a device only ever receives the slice it holds. Our parameters stack
layers on a leading axis and store Dense kernels as [in, out]; HF stores
per-layer tensors as [out, in].
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from ragen_jax import paths
from ragen_jax.models.config import ModelConfig

_LAYER_TENSORS = {  # our name under "layers" -> (HF suffix, is a Dense kernel)
    ("q_proj", "kernel"): ("self_attn.q_proj.weight", True),
    ("k_proj", "kernel"): ("self_attn.k_proj.weight", True),
    ("v_proj", "kernel"): ("self_attn.v_proj.weight", True),
    ("o_proj", "kernel"): ("self_attn.o_proj.weight", True),
    ("q_proj", "bias"): ("self_attn.q_proj.bias", False),
    ("k_proj", "bias"): ("self_attn.k_proj.bias", False),
    ("v_proj", "bias"): ("self_attn.v_proj.bias", False),
    ("q_norm", "scale"): ("self_attn.q_norm.weight", False),  # Qwen3
    ("k_norm", "scale"): ("self_attn.k_norm.weight", False),
    ("gate_proj", "kernel"): ("mlp.gate_proj.weight", True),
    ("up_proj", "kernel"): ("mlp.up_proj.weight", True),
    ("down_proj", "kernel"): ("mlp.down_proj.weight", True),
    ("input_layernorm", "scale"): ("input_layernorm.weight", False),
    ("post_attention_layernorm", "scale"): ("post_attention_layernorm.weight", False),
}
_GLOBAL_TENSORS = {
    ("embed_tokens", "embedding"): ("model.embed_tokens.weight", False),
    ("norm", "scale"): ("model.norm.weight", False),
    ("lm_head", "kernel"): ("lm_head.weight", True),
}


class CheckpointError(ValueError):
  """A checkpoint directory is missing a tensor, has a wrong shape, or is malformed."""


def read_hf_config(path: str | os.PathLike) -> dict:
  """The parsed config.json of the model directory `path` (CheckpointError when it is missing or not JSON)."""
  config_file = Path(path) / "config.json"
  if not config_file.is_file():
    raise CheckpointError(f"{path} has no config.json: not a Hugging Face model directory")
  try:
    return json.loads(config_file.read_text())
  except json.JSONDecodeError as error:
    raise CheckpointError(f"{config_file} is not valid JSON: {error}") from error


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # fast, sentencepiece, byte-level BPE
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")  # besides tokenizer_config.json's key


def _has_chat_template(path: Path) -> bool:
  if any((path / name).is_file() for name in CHAT_TEMPLATE_FILES):
    return True
  tokenizer_config = path / "tokenizer_config.json"
  if not tokenizer_config.is_file():
    return False
  try:
    return bool(json.loads(tokenizer_config.read_text()).get("chat_template"))
  except json.JSONDecodeError as error:
    raise CheckpointError(f"{tokenizer_config.name} is not valid JSON: {error}") from error


def _training_run_hint(path: Path) -> str | None:
  """What to load instead when `path` is (part of) a training run rather than a model directory."""
  if (path / "_CHECKPOINT_METADATA").is_file():
    run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    return (f"an Orbax training checkpoint (one step), not a Hugging Face model directory; load the run's "
            f"exported policy {run / 'final_model'}")
  if path.name == "checkpoints" and any((step / "_CHECKPOINT_METADATA").is_file() for step in path.iterdir()):
    return f"a run's Orbax checkpoints, not a Hugging Face model directory; load {path.parent / 'final_model'}"
  if (path / "checkpoints").is_dir() or (path / "final_model").is_dir():
    return f"a training run directory, not a model directory; load its exported policy {path / 'final_model'}"
  return None


def check_model_dir(path: str | os.PathLike) -> None:
  """Checks that the model directory `path` holds what loading needs, before any tensor is read.

  Raises CheckpointError saying what is wrong and what to give instead (the caller names the path): a missing
  path, a file, a training run or Orbax checkpoint in place of an HF directory, no or an unsupported
  config.json, no *.safetensors, no tokenizer files, no chat template.
  """
  if "://" in str(path):
    raise CheckpointError("models load from a local directory; stage it first (ragen_jax.paths.staged)")
  path = Path(path).expanduser()
  if not path.exists():
    raise CheckpointError("no such directory")
  if not path.is_dir():
    raise CheckpointError("a file; give the Hugging Face model directory that holds config.json")
  hint = _training_run_hint(path)
  if hint:
    raise CheckpointError(hint)
  if not (path / "config.json").is_file():
    raise CheckpointError("no config.json: not a Hugging Face model directory")
  try:
    ModelConfig.from_hf(read_hf_config(path))
  except KeyError as error:
    raise CheckpointError(f"config.json lacks the key {error}") from error
  except (TypeError, ValueError) as error:  # CheckpointError (not JSON) is a ValueError
    raise CheckpointError(f"config.json: {error}") from error
  if not (path / "model.safetensors.index.json").is_file() and not any(path.glob("*.safetensors")):
    raise CheckpointError("no *.safetensors weights (only safetensors load: convert .bin or .gguf weights first)")
  if not any((path / name).is_file() for name in TOKENIZER_FILES):
    raise CheckpointError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}); copy them from the model's "
                          f"original repository")
  if not _has_chat_template(path):
    raise CheckpointError(f"the tokenizer has no chat template (tokenizer_config.json 'chat_template' or "
                          f"{' / '.join(CHAT_TEMPLATE_FILES)}), which renders every prompt; use the instruct "
                          f"model's tokenizer files")


def tensor_files(path: str | os.PathLike) -> dict[str, Path]:
  """Maps every tensor name to the safetensors file that holds it."""
  path = Path(path)
  index = path / "model.safetensors.index.json"
  if index.is_file():
    weight_map = json.loads(index.read_text())["weight_map"]
    return {name: path / file for name, file in weight_map.items()}
  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise CheckpointError(f"no *.safetensors files in {path}")
  names = {}
  for file in files:
    with safe_open(file, framework="numpy") as f:
      names.update({name: file for name in f.keys()})
  return names


def _hf_tensor_plan(config: ModelConfig, param_path: tuple[str, ...]) -> tuple[list[str] | str, bool]:
  """(HF name, or one name per layer for stacked params; transposed?) for one param path."""
  if param_path[0] == "layers":
    suffix, transpose = _LAYER_TENSORS[param_path[1:]]
    return [f"model.layers.{i}.{suffix}" for i in range(config.num_layers)], transpose
  return _GLOBAL_TENSORS[param_path]


def hf_layer_tensor(config: ModelConfig, module: str) -> list[str]:
  """The HF names, one per layer, of the weight of layer module `module` (`q_proj`, ..., `down_proj`)."""
  return _hf_tensor_plan(config, ("layers", module, "kernel"))[0]


class _LazyTensors:
  """Open safetensors files; reads named slices on demand."""

  def __init__(self, files: dict[str, Path], stack: contextlib.ExitStack):
    self._files = files
    self._handles = {f: stack.enter_context(safe_open(f, framework="numpy")) for f in set(files.values())}

  def slice(self, name: str):
    if name not in self._files:
      raise CheckpointError(f"tensor {name!r} is missing from the checkpoint")
    return self._handles[self._files[name]].get_slice(name)


def _reader(lazy: _LazyTensors, names, transpose: bool, shape, dtype) -> Callable:
  """make_array_from_callback reader for one of our params."""
  stacked = isinstance(names, list)
  per_layer_shape = tuple(shape[1:]) if stacked else tuple(shape)
  hf_shape = per_layer_shape[::-1] if transpose else per_layer_shape
  for name in names if stacked else [names]:
    got = tuple(lazy.slice(name).get_shape())
    if got != hf_shape:
      raise CheckpointError(f"tensor {name!r} has shape {got}, expected {hf_shape}")

  def read_one(name, index):
    hf_index = index[::-1] if transpose else index
    block = lazy.slice(name)[tuple(hf_index)]
    return (block.T if transpose else block).astype(dtype)

  def read(index):
    if not stacked:
      return read_one(names, index)
    layers = range(*index[0].indices(len(names)))
    return np.stack([read_one(names[i], index[1:]) for i in layers])

  return read


def load_params(path, config: ModelConfig, abstract, shardings) -> dict:
  """Reads HF safetensors into our (unboxed) param tree, each leaf placed with `shardings`.

  `abstract` (ShapeDtypeStruct leaves, from `models.model.abstract_params`) gives our
  param structure and each leaf's shape and dtype; `shardings` is a pytree of
  NamedSharding with the same structure.
  """
  abstract = traverse_util.flatten_dict(abstract)
  flat_shardings = traverse_util.flatten_dict(shardings)
  params = {}
  with contextlib.ExitStack() as stack:
    lazy = _LazyTensors(tensor_files(path), stack)
    for param_path, leaf in abstract.items():
      names, transpose = _hf_tensor_plan(config, param_path)
      read = _reader(lazy, names, transpose, leaf.shape, np.dtype(leaf.dtype))
      params[param_path] = jax.make_array_from_callback(leaf.shape, flat_shardings[param_path], read)
  return traverse_util.unflatten_dict(params)


def export_hf(params, config: ModelConfig, out_dir: str | os.PathLike, tokenizer=None) -> str:
  """Writes `params` as a transformers-loadable directory (config.json + model.safetensors) to `out_dir`, local or
  `gs://`; returns it."""
  tensors = {}
  for param_path, value in traverse_util.flatten_dict(params).items():
    if param_path[0] == "value_head":
      continue
    names, transpose = _hf_tensor_plan(config, param_path)
    value = np.asarray(jax.device_get(value))
    if isinstance(names, list):
      for i, name in enumerate(names):
        tensors[name] = np.ascontiguousarray(value[i].T if transpose else value[i])
    else:
      tensors[names] = np.ascontiguousarray(value.T if transpose else value)
  with paths.writing_dir(out_dir) as local:
    save_file(tensors, os.path.join(local, "model.safetensors"), metadata={"format": "pt"})
    paths.write_text(os.path.join(local, "config.json"), json.dumps(config.to_hf(), indent=2))
    if tokenizer is not None:
      tokenizer.save_pretrained(local)
  return os.fspath(out_dir)
