"""LoRA adapters for the scanned decoder: settings, the frozen/trainable split, merging, and PEFT files.

With `ModelConfig.lora` set, each targeted projection of every layer gets an adapter module `<proj>_lora` with
`a: [L, in, r]` and `b: [r, out]` per layer (`b` starts at zero, so a fresh adapter leaves the model unchanged),
and computes `x W + (alpha / r) (x a) b`, PEFT's LoRA. The parameter tree is the base tree plus those subtrees:

* `split(config, params) -> (base, trainable)`: the frozen base weights and what training changes (the adapters,
  and a critic's value head). Without LoRA the base is None and everything is trainable. `combine` puts them
  back together (no copy: the same arrays in one tree).
* The frozen reference model under LoRA is the base with adapters off: `without(config)` and the base tree, no
  second copy of the weights.
* `merge` folds the adapters into the kernels: the sampler decodes with merged weights (faster than the adapters
  in the forward, `bench/sampler.py`), and the merged model is what transformers loads; `save_adapters` and
  `load_adapters` write and read the adapters alone in PEFT's layout (`adapter_config.json`,
  `adapter_model.safetensors`), which `peft.PeftModel.from_pretrained` loads onto the transformers model.

Why our own and not qwix's `LoraProvider`: qwix adds adapters by intercepting the matmuls of a module at trace
time, which suits models we do not own. Here the adapters are two `param`s next to the kernel they adapt, created
with logical axes, so (1) they shard with the same partition rules as their kernel (`a` like the kernel's input
axis, `b` like its output axis) and stack under `nn.scan` like every other layer weight, (2) "adapters off" is a
static config switch over the same base tree, and (3) the PEFT names and the merge follow `hf_io`'s tensor plan.
It is ~30 lines of module code (`transformer.LoraAdapter`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save

from ragen_jax import paths
from ragen_jax.config import check
from ragen_jax.models.config import ModelConfig
from ragen_jax.models.hf_io import CheckpointError, hf_layer_tensor

PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
               "down": "down_proj"}  # `targets` name -> the projection (and HF module) it adapts
ADAPTER_SUFFIX = "_lora"  # the adapter module of projection `q_proj` is `q_proj_lora`
TRAINABLE_HEADS = ("value_head",)  # trained whole next to the adapters (a critic's scalar head)
PEFT_PREFIX = "base_model.model."  # PEFT's prefix of the wrapped transformers model's tensor names


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """The `model.lora` config section: LoRA adapters (rank 0: off, every weight trained).

  `alpha / rank` scales the adapters' output (PEFT's `lora_alpha`). `targets`: the projections adapted, any of
  q, k, v, o, gate, up, down. `dropout` on the adapters' input must be 0 (the RL update scores the same tokens it
  sampled; dropout is not implemented). Hashable: part of the static `ModelConfig`.
  """

  rank: int = 0
  alpha: float = 16.0
  dropout: float = 0.0
  targets: tuple[str, ...] = tuple(PROJECTIONS)

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))  # a ConfigDict may hand over a list
    check("model.lora.rank", self.rank >= 0, "must be >= 0 (0: no adapters, full fine-tuning)", self.rank)
    check("model.lora.alpha", self.alpha > 0, "must be > 0", self.alpha)
    check("model.lora.dropout", self.dropout == 0, "only 0 is supported (no dropout on the adapters)", self.dropout)
    check("model.lora.targets", bool(self.targets) and set(self.targets) <= set(PROJECTIONS)
          and len(set(self.targets)) == len(self.targets), f"must be distinct names from {tuple(PROJECTIONS)}",
          self.targets)

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  @property
  def projections(self) -> tuple[str, ...]:
    """The adapted projections' module names (`q_proj`, ...)."""
    return tuple(PROJECTIONS[t] for t in self.targets)


def without(config: ModelConfig) -> ModelConfig:
  """`config` with its adapters off (the base model; unchanged without LoRA)."""
  return config if config.lora is None else dataclasses.replace(config, lora=None)


def _is_trainable(path: tuple[str, ...]) -> bool:
  return any(key.endswith(ADAPTER_SUFFIX) or key in TRAINABLE_HEADS for key in path)


def split(config: ModelConfig, tree) -> tuple[dict | None, dict]:
  """(base, trainable) parts of a param-shaped tree (params, specs, shardings): without LoRA (None, tree); with
  it the frozen base weights and the adapters (plus a value head). `combine` inverts it."""
  if config.lora is None:
    return None, tree
  flat = traverse_util.flatten_dict(tree)
  base = {path: leaf for path, leaf in flat.items() if not _is_trainable(path)}
  trainable = {path: leaf for path, leaf in flat.items() if _is_trainable(path)}
  return traverse_util.unflatten_dict(base), traverse_util.unflatten_dict(trainable)


def combine(base: dict | None, trainable: dict) -> dict:
  """The whole tree of a `split` (the same leaves, nothing copied)."""
  if base is None:
    return trainable
  return traverse_util.unflatten_dict(traverse_util.flatten_dict(base) | traverse_util.flatten_dict(trainable))


def merge(config: ModelConfig, params) -> dict:
  """Params of `without(config)`: each adapted kernel replaced by `kernel + scale * a @ b` (computed in float32,
  stored in the kernel's dtype). Jittable."""
  if config.lora is None:
    return params
  layers = dict(params["layers"])
  for name in config.lora.projections:
    adapter = layers.pop(name + ADAPTER_SUFFIX)
    kernel = layers[name]["kernel"]
    delta = jnp.einsum("lir,lro->lio", adapter["a"].astype(jnp.float32), adapter["b"].astype(jnp.float32))
    layers[name] = {**layers[name], "kernel": (kernel.astype(jnp.float32) + config.lora.scale * delta)
                    .astype(kernel.dtype)}
  return {**params, "layers": layers}


def _peft_names(config: ModelConfig, projection: str) -> tuple[list[str], list[str]]:
  """PEFT's tensor names of one projection's adapter, per layer: (lora_A names, lora_B names)."""
  names = [PEFT_PREFIX + name.removesuffix(".weight") for name in hf_layer_tensor(config, projection)]
  return [f"{n}.lora_A.weight" for n in names], [f"{n}.lora_B.weight" for n in names]


def save_adapters(config: ModelConfig, adapters, out_dir: str | os.PathLike, base_model: str = "") -> str:
  """Writes the adapters of `adapters` (a trainable tree or whole params) as a PEFT LoRA directory to `out_dir`,
  local or `gs://`; returns it."""
  layers = jax.device_get(adapters["layers"])
  tensors = {}
  for name in config.lora.projections:
    a_names, b_names = _peft_names(config, name)
    a, b = np.asarray(layers[name + ADAPTER_SUFFIX]["a"]), np.asarray(layers[name + ADAPTER_SUFFIX]["b"])
    for i in range(config.num_layers):  # PEFT: lora_A.weight [r, in], lora_B.weight [out, r]
      tensors[a_names[i]] = np.ascontiguousarray(a[i].T)
      tensors[b_names[i]] = np.ascontiguousarray(b[i].T)
  payload = save(tensors, metadata={"format": "pt"})
  peft_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": config.lora.rank,
                 "lora_alpha": config.lora.alpha, "lora_dropout": config.lora.dropout,
                 "target_modules": list(config.lora.projections), "bias": "none", "fan_in_fan_out": False,
                 "use_rslora": False, "base_model_name_or_path": base_model}
  paths.write_bytes(paths.join(out_dir, "adapter_model.safetensors"), payload)
  paths.write_text(paths.join(out_dir, "adapter_config.json"), json.dumps(peft_config, indent=2))
  return os.fspath(out_dir)


def check_adapter_dir(path: str | os.PathLike, lora: LoraConfig) -> None:
  """Raises CheckpointError unless `path` holds PEFT LoRA adapters of `lora`'s rank, alpha and targets."""
  config_file, tensor_file = paths.join(path, "adapter_config.json"), paths.join(path, "adapter_model.safetensors")
  if not paths.exists(config_file) or not paths.exists(tensor_file):
    raise CheckpointError(f"{path} is not a LoRA adapter directory (adapter_config.json and "
                          f"adapter_model.safetensors, as a run's final_adapters/ holds)")
  try:
    saved = json.loads(paths.read_text(config_file))
  except json.JSONDecodeError as error:
    raise CheckpointError(f"{config_file} is not JSON: {error}") from error
  want = {"r": lora.rank, "lora_alpha": lora.alpha, "target_modules": sorted(lora.projections)}
  got = {"r": saved.get("r"), "lora_alpha": saved.get("lora_alpha"),
         "target_modules": sorted(saved.get("target_modules") or [])}
  if saved.get("peft_type") != "LORA" or got != want:
    raise CheckpointError(f"the adapters in {path} have {got} (peft_type {saved.get('peft_type')!r}); this run's "
                          f"model.lora asks for {want}: set model.lora.rank, alpha and targets to match")


def load_adapters(path: str | os.PathLike, config: ModelConfig, abstract, shardings) -> dict:
  """Reads PEFT adapters (`save_adapters`) into the adapter tree of `config`, each leaf placed with `shardings`.

  `abstract` / `shardings`: the trainable part (`split`) of `models.model.abstract_params` / `param_shardings`.
  """
  check_adapter_dir(path, config.lora)
  out = {}
  with safe_open(paths.join(path, "adapter_model.safetensors"), framework="numpy") as tensors:
    known = set(tensors.keys())
    for name in config.lora.projections:
      for leaf_name, names in zip(("a", "b"), _peft_names(config, name)):
        leaf = abstract["layers"][name + ADAPTER_SUFFIX][leaf_name]
        missing = [n for n in names if n not in known]
        if missing:
          raise CheckpointError(f"tensor {missing[0]!r} is missing from {path}")
        stacked = np.stack([tensors.get_tensor(n).T for n in names]).astype(leaf.dtype)
        if stacked.shape != leaf.shape:
          raise CheckpointError(f"the {name} adapters in {path} have shape {stacked.shape}, this model needs "
                                f"{leaf.shape}")
        sharding = shardings["layers"][name + ADAPTER_SUFFIX][leaf_name]
        out[(name + ADAPTER_SUFFIX, leaf_name)] = jax.make_array_from_callback(
            stacked.shape, sharding, lambda index, x=stacked: x[index])
  return {"layers": traverse_util.unflatten_dict(out)}
