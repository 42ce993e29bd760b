"""Does a training config fit a slice, and how fast could it run: the compiler's plan, without the hardware.

`plan(config, plan_config)` builds the config's mesh over fake CPU devices, lowers and compiles one iteration's
programs (the rollout, then the update's score, diagnose and learn phases of `rl.update`) at the config's real
shapes with abstract inputs (`jax.ShapeDtypeStruct` with shardings: no weight is allocated), and reads each
program's per-device memory from `compiled.memory_analysis()`. A phase's peak adds its new outputs and temporaries
to what the trainer holds on the device meanwhile (`PhaseMemory.held`: the whole train state, the loaded weights,
the batch; a program's argument bytes leave out what it does not read).

FLOPs are counted analytically (`iteration_flops`): XLA's `cost_analysis()` counts the body of a while loop once,
and the layers (`nn.scan`), the decode loop, micro-batches and PPO epochs are all loops. The count is an upper
bound: every decode step of every turn runs, and no micro-batch is skipped by the filter.

Chip peaks (`CHIPS`, per chip; bf16 dense matmul FLOP/s and HBM as the vendors state them): TPU v5e 197 TF/s,
16 GiB; v6e (Trillium) 918 TF/s, 32 GiB; v4 275 TF/s, 32 GiB; v5p 459 TF/s, 95 GiB (Google Cloud TPU system
architecture pages, cloud.google.com/tpu/docs/v5e, v6e, v4, v5p); H100 SXM 989 TF/s dense (1,979 with sparsity),
80 GB; H200 SXM 989 TF/s, 141 GB (NVIDIA H100 and H200 datasheets). GPU memory in GB is compared as GiB here.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import transformers
from jax._src import xla_bridge  # backends_are_initialized: no public API tells whether the backend started
from jax.sharding import NamedSharding

from ragen_jax import assembly, paths
from ragen_jax.config import ConfigError, check, check_one_of, did_you_mean
from ragen_jax.diagnostics.collapse import init_diagnostics_state
from ragen_jax.models import CheckpointError, Model, lora
from ragen_jax.models.config import DTYPES, ModelConfig
from ragen_jax.models.flops import causal_key_pairs, forward_flops, train_pass_flops
from ragen_jax.models.gguf_convert import bundled_tokenizer_dir
from ragen_jax.models.hf_io import TOKENIZER_FILES, read_hf_config
from ragen_jax.models.model import abstract_params, input_sharding, param_shardings
from ragen_jax.models.partitioning import logical_to_spec
from ragen_jax.models.scratch import SCRATCH_TINY, TINY_DIMS, scratch_config
from ragen_jax.models.shapes import SHAPES, shape_config
from ragen_jax.models.transformer import CACHE_BLOCK, KVCache
from ragen_jax.rl import update as update_lib
from ragen_jax.rollout.device import play_episodes, slot_layout
from ragen_jax.rollout.episodes import reset_batch
from ragen_jax.rollout.source import DeviceSource
from ragen_jax.sampling import decode, prefill
from ragen_jax.trainer import Settings, read_settings
from ragen_jax.trajectories import TrajectoryWriter

GIB = 2**30
BUNDLED_SHAPE = "smollm2-135m"  # model.path "" (the bundled SmolLM2-135M-Instruct)
LORA_RANK = 64  # the adapters' rank the search for a setting that fits tries


@dataclasses.dataclass(frozen=True)
class Chip:
  hbm_gib: float
  peak_tflops: float  # bf16 dense matmul, per chip


CHIPS = {"v5e": Chip(16, 197), "v6e": Chip(32, 918), "v4": Chip(32, 275), "v5p": Chip(95, 459),
         "h100": Chip(80, 989), "h200": Chip(141, 989)}


@dataclasses.dataclass(frozen=True)
class PlanConfig:
  """The `--plan.*` flags: the slice (`devices` chips of kind `chip`), `json` (a path to write the result to,
  "": none) and `fit` (when it does not fit, re-plan cheaper settings until one does)."""

  devices: int = 8
  chip: str = "v5e"
  json: str = ""
  fit: bool = True

  def __post_init__(self):
    check("plan.devices", self.devices >= 1, "must be >= 1", self.devices)
    check_one_of("plan.chip", self.chip, CHIPS)


@dataclasses.dataclass(frozen=True)
class PhaseMemory:
  """One compiled program's per-device bytes (`memory_analysis()`), and `held`: what the trainer holds on the
  device during it (the train state, loaded weights and reference, the batch and scores, the program's other
  arguments), read or not; outputs that reuse a donated argument (`alias`) take no new memory."""

  name: str
  argument: int
  output: int
  alias: int
  temp: int
  held: int

  @property
  def peak(self) -> int:
    return self.held + self.output - self.alias + self.temp


@dataclasses.dataclass(frozen=True)
class Plan:
  """One setting planned on one slice; bytes are per device, FLOPs of one iteration over all devices."""

  model: str
  num_params: int
  devices: int
  chip: str
  mesh: dict[str, int]
  seq_len: int
  overrides: dict[str, object]  # the config changes this plan was made with (none for the config as given)
  memory: dict[str, int]  # params, optimizer, critic (with its optimizer), loaded weights, reference, KV cache, batch
  phases: tuple[PhaseMemory, ...]
  flops: dict[str, float]  # rollout, score, learn (analytic upper bounds)

  @property
  def peak(self) -> int:
    return max(p.peak for p in self.phases)

  @property
  def hbm(self) -> int:
    return int(CHIPS[self.chip].hbm_gib * GIB)

  @property
  def fits(self) -> bool:
    return self.peak <= self.hbm

  @property
  def iteration_flops(self) -> float:
    return sum(self.flops.values())

  @property
  def ideal_seconds(self) -> float:
    """One iteration at the chips' peak bf16 FLOP/s (no communication, no idle decode steps)."""
    return self.iteration_flops / (self.devices * CHIPS[self.chip].peak_tflops * 1e12)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self) | {"peak": self.peak, "hbm": self.hbm, "fits": self.fits,
                                       "iteration_flops": self.iteration_flops, "ideal_seconds": self.ideal_seconds,
                                       "phases": [dataclasses.asdict(p) | {"peak": p.peak} for p in self.phases]}

  def lines(self) -> list[str]:
    """The plan as text."""
    gib = lambda n: f"{n / GIB:7.2f} GiB"  # noqa: E731
    mesh = ", ".join(f"{k}={v}" for k, v in self.mesh.items())
    out = [f"{self.model} ({self.num_params / 1e6:,.0f}M parameters) on {self.devices} x {self.chip} (mesh {mesh}), "
           f"sequences of {self.seq_len} tokens" + (f"; with {_overrides_text(self.overrides)}" if self.overrides
                                                    else ""),
           "per device:"]
    out += [f"  {name:<16s}{gib(size)}" for name, size in self.memory.items()]
    out.append(f"  {'phase':<10s}{'arguments':>12s}{'outputs':>12s}{'aliased':>12s}{'temporaries':>12s}"
               f"{'held':>12s}{'peak':>12s}   (GiB; compiler's memory_analysis, held by the trainer)")
    for p in self.phases:
      out.append(f"  {p.name:<10s}" + "".join(f"{n / GIB:12.2f}" for n in (p.argument, p.output, p.alias, p.temp,
                                                                         p.held, p.peak)))
    flops = ", ".join(f"{k} {v:.3g}" for k, v in self.flops.items())
    out.append(f"FLOPs of one iteration (analytic, an upper bound; diagnose not counted): {self.iteration_flops:.3g} "
               f"({flops}); ideal {self.ideal_seconds:.1f} s at {CHIPS[self.chip].peak_tflops:g} TF/s x "
               f"{self.devices} chips")
    verdict = "fits" if self.fits else "does NOT fit"
    out.append(f"verdict: {verdict}: peak {self.peak / GIB:.2f} GiB of {CHIPS[self.chip].hbm_gib:g} GiB HBM per "
               f"{self.chip} ({self.peak / self.hbm:.0%})")
    return out


@dataclasses.dataclass(frozen=True)
class PlanResult:
  """The plan of the config as given and, when it does not fit, the first cheaper setting that does (`fit`; None
  when none tried fits or the search was off)."""

  plan: Plan
  tried: tuple[dict, ...] = ()
  fit: Plan | None = None

  def lines(self) -> list[str]:
    out = self.plan.lines()
    if self.plan.fits or not self.tried:
      return out
    if self.fit is None:
      return out + [f"no setting tried fits (last: {_overrides_text(self.tried[-1])})"]
    return out + ["", f"smallest change tried that fits: {_overrides_text(self.fit.overrides)}", *self.fit.lines()]

  def to_dict(self) -> dict:
    return {"plan": self.plan.to_dict(), "tried": list(self.tried),
            "fit": None if self.fit is None else self.fit.to_dict()}


def _overrides_text(overrides: dict) -> str:
  return " ".join(f"--{'plan' if k == 'devices' else 'config'}.{k}={v}" for k, v in overrides.items())


def use_cpu_devices(count: int) -> None:
  """Starts the backend with `count` fake CPU devices; when it already runs, it must be CPU with at least
  `count` devices (ConfigError otherwise)."""
  if not xla_bridge.backends_are_initialized():
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", count)
  if jax.devices()[0].platform != "cpu" or jax.device_count() < count:
    raise ConfigError(f"plan.devices={count}: this process already has {jax.device_count()} "
                      f"{jax.devices()[0].platform} devices; plan in a fresh process")


def planned_model(path: str, computation: dict) -> tuple[ModelConfig, object]:
  """(model config, tokenizer) of `model.path`: a built-in shape (`models.shapes`), "" (the bundled model's shape),
  `scratch:tiny`, or a local HF directory of which only config.json (and tokenizer files, when it has them) is
  read. Built-in shapes use the bundled tokenizer (no download)."""
  if path == SCRATCH_TINY:
    tokenizer = transformers.AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
    return dataclasses.replace(scratch_config(tokenizer, **TINY_DIMS), **computation), tokenizer
  if path in SHAPES or not path:
    return (shape_config(path or BUNDLED_SHAPE, **computation),
            transformers.AutoTokenizer.from_pretrained(bundled_tokenizer_dir()))
  if paths.is_remote(path):  # only config.json and the tokenizer are read: stage just those
    path = assembly.staged_dir(path, "model.path", only=("config.json", *TOKENIZER_FILES))
  if not os.path.isdir(path):
    raise ConfigError(f"model.path={path!r}: neither a built-in shape nor a model directory"
                      f"{did_you_mean(path, SHAPES) or '; built-in shapes: ' + ', '.join(SHAPES)}")
  try:
    config = ModelConfig.from_hf(read_hf_config(path), **computation)
  except (CheckpointError, ValueError, KeyError) as error:
    raise ConfigError(f"model.path={path!r}: {error}") from error
  own = any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES)
  return config, transformers.AutoTokenizer.from_pretrained(path if own else bundled_tokenizer_dir())


def _settings(config) -> Settings:
  """`trainer.read_settings` of `config`; its model directory check (which wants weights) is skipped: the
  path was resolved by `planned_model`."""
  checked = copy.deepcopy(config)
  checked.model.path = SCRATCH_TINY
  return dataclasses.replace(read_settings(checked), model=assembly.ModelSettings(**config.model.to_dict()))


def _with_shardings(abstract, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def _outputs(compiled):
  """The abstract outputs (with shardings) of a compiled program."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), compiled.out_info)


def device_bytes(tree) -> int:
  """Bytes of one device's shards of a tree of sharded abstract (or real) arrays."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _memory(name: str, compiled, held: int) -> PhaseMemory:
  m = compiled.memory_analysis()
  return PhaseMemory(name, m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes,
                     m.temp_size_in_bytes, held)


def compile_iteration(model_config: ModelConfig, settings: Settings, mesh, source, seed: int = 0):
  """(abstract inputs, {phase: compiled}) of one training iteration, built as the trainer builds them
  (`trainer.initial_state`, `reference_params`, `Trainer.train_iteration`). The inputs: policy (the loaded
  weights, with LoRA the base and fresh adapters), state, reference (None without the KL loss), batch and scores.
  Every call of the phases is here."""
  update = settings.update_config()
  batch_size = update.batch_size
  policy = _with_shardings(abstract_params(model_config), param_shardings(model_config, mesh))
  base, trained = lora.split(model_config, policy)  # with LoRA the state holds the adapters, over a frozen base
  critic = None
  if update.algorithm.use_critic:
    critic = lora.split(model_config, _with_shardings(abstract_params(model_config, True),
                                                      param_shardings(model_config, mesh, True)))[1]
  diagnostics = None if update.diagnostics_fn is None else init_diagnostics_state(update.diagnostics_fn.cfg)
  init = jax.jit(lambda p, c: update_lib.in_layout(model_config, update, update_lib.init_train_state(
      update, p, jax.random.PRNGKey(seed), c, diagnostics)))  # the layout the trainer keeps the state in
  ref = None
  if settings.algorithm.use_kl_loss:  # the base with adapters off under LoRA
    ref_dtype = DTYPES[settings.model.reference_dtype]
    ref = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, ref_dtype, sharding=a.sharding),
                       policy if base is None else base)
  compiled = {}
  with jax.set_mesh(mesh):
    state = _outputs(init.lower(trained, critic).compile())
    # the sampler decodes with LoRA adapters merged: weights of the base's shapes and shardings, a copy
    compiled |= compile_rollout(lora.without(model_config), source, state.policy if base is None else base,
                                batch_size, mesh)
    if "rollout" in compiled:  # the update's batch is the device rollout's output, in the layout it leaves in
      batch = _outputs(compiled["rollout"])
    else:  # a host rollout's, placed by `models.put_batch`
      empty = jax.eval_shape(lambda: TrajectoryWriter.empty(batch_size, source.seq_len, settings.rollout.max_turns)
                             .finish(jnp.zeros(batch_size, bool), jnp.zeros(batch_size, jnp.int32)))
      batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=input_sharding(mesh, a.shape)),
                           empty)
    compiled["score"] = update_lib.score.lower(model_config, update, state, ref, batch, base).compile()
    scores = _outputs(compiled["score"])
    compiled["diagnose"] = update_lib.diagnose.lower(model_config, update, state, batch, scores, base).compile()
    compiled["learn"] = update_lib.learn.lower(model_config, update, state, batch, scores, base).compile()
  return {"policy": policy, "state": state, "ref": ref, "batch": batch, "scores": scores}, compiled


def compile_rollout(model_config: ModelConfig, source, policy, batch_size: int, mesh) -> dict:
  """{"rollout": compiled} of a device source's whole episodes, or {"prefill", "decode"} of a host text source's
  sampler at its longest history (`rollout.max_episode_len`)."""
  rollout = source.config
  put = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=input_sharding(mesh, a.shape))  # noqa: E731
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # the trainer makes its keys on the host: uncommitted
  group_ids = put(jax.ShapeDtypeStruct((batch_size,), jnp.int32))  # and the seeds: as `DeviceSource.run` puts them
  if isinstance(source, DeviceSource):
    env_state = _outputs(reset_batch.lower(source.env, source.env_params, group_ids).compile())
    return {"rollout": play_episodes.lower(model_config, policy, source.env, source.env_params, source.assets, rollout,
                                           env_state, group_ids, key).compile()}
  tokens = put(jax.ShapeDtypeStruct((batch_size, source.seq_len), jnp.int32))
  valid = put(jax.ShapeDtypeStruct((batch_size, source.seq_len), bool))
  filled = prefill.lower(model_config, policy, tokens, valid, source.seq_len + rollout.max_new_tokens).compile()
  return {"prefill": filled, "decode": decode.lower(model_config, policy, _outputs(filled), key, rule=rollout.rule,
                                                    max_new_tokens=rollout.max_new_tokens).compile()}


def kv_cache_bytes(model_config: ModelConfig, mesh, batch_size: int, slots: int) -> int:
  """Per-device bytes of the sampler's KV cache for `batch_size` rows of `slots` slots."""
  cache = jax.eval_shape(lambda: KVCache.zeros(model_config, batch_size, slots))
  sharded = NamedSharding(mesh, logical_to_spec(KVCache.KV_AXES))
  return 2 * math.prod(sharded.shard_shape(cache.k.shape)) * np.dtype(cache.k.dtype).itemsize


# ---- FLOPs ------------------------------------------------------------------------------------------------------
def _cached_keys(end: int, slots: int, block: int = CACHE_BLOCK) -> int:
  """Keys one query reads in `transformer.cached_attention` with `end` slots filled."""
  return -(-end // min(block, slots)) * min(block, slots)


def rollout_flops(c: ModelConfig, source, batch_size: int) -> float:
  """A rollout's forward FLOPs when every turn runs and every reply takes all `max_new_tokens` decode steps."""
  rollout = source.config
  new, turns = rollout.max_new_tokens, rollout.max_turns
  if isinstance(source, DeviceSource):
    first, later, slots = slot_layout(source.assets, rollout)
    chunks = [(first, 0)] + [(later, first + new + (k - 1) * (later + new)) for k in range(1, turns)]  # (len, start)
  else:  # every turn re-prefills up to the whole episode
    slots = source.seq_len + new
    chunks = [(source.seq_len, 0)] * turns
  total = 0.0
  for length, offset in chunks:
    end = offset + length
    total += forward_flops(c, length, length * _cached_keys(end, slots), 1)
    total += sum(forward_flops(c, 1, _cached_keys(end + j + 1, slots), 1) for j in range(new))
  return batch_size * total


def update_flops(c: ModelConfig, settings: Settings, seq_len: int) -> dict[str, float]:
  """{"score", "learn"}: the update's FLOPs on a full batch (no group filtered out): the scoring forwards, and per
  PPO epoch a forward and backward (`train_pass_flops`) plus what remat recomputes (`full`: every layer's forward,
  `dots`: no matmul; `logits_chunk`: the LM head's forward)."""
  update = settings.update_config()
  tokens = update.batch_size * seq_len
  pairs = update.batch_size * causal_key_pairs(seq_len)
  trunk = forward_flops(c, tokens, pairs, 0)
  head = forward_flops(c, 0, 0, tokens)
  score = trunk + head + (trunk + head if settings.algorithm.use_kl_loss else 0.0)
  recompute = trunk if c.remat == "full" else 0.0
  learn = train_pass_flops(c, tokens, pairs, tokens) + recompute + (head if c.logits_chunk else 0.0)
  if settings.algorithm.use_critic:  # the trunk again, with a value head of one output
    score += trunk
    learn += train_pass_flops(c, tokens, pairs, 0) + recompute
  return {"score": score, "learn": update.ppo_epochs * learn}


# ---- planning ---------------------------------------------------------------------------------------------------
def plan(config, plan_config: PlanConfig, overrides: dict | None = None) -> Plan:
  """The plan of training `config` on `plan_config`'s slice (the backend must already have the devices:
  `use_cpu_devices`). `overrides`: dotted config keys (and `devices`) to change first.

  Clears JAX's in-memory caches of compiled programs before returning: XLA:CPU maps each executable's code in
  thousands of memory maps (a 3B iteration's programs about 3,000), which JAX's caches keep alive, and a dozen
  plans would pass the kernel's default limit of 65,530 maps per process (LLVM then aborts the process)."""
  overrides = dict(overrides or {})
  config = copy.deepcopy(config)
  devices = overrides.get("devices", plan_config.devices)
  for key, value in overrides.items():
    if key != "devices":
      *sections, name = key.split(".")
      node = config
      for section in sections:
        node = node[section]
      node[name] = value
  settings = _settings(config)
  model_config, tokenizer = planned_model(settings.model.path, settings.model.computation())
  config.mesh.num_devices = devices
  if devices > jax.device_count():
    raise ConfigError(f"plan.devices={devices}: only {jax.device_count()} devices here")
  mesh = assembly.build_mesh(config, settings.update_config().batch_size)
  model = Model(config=model_config, params=abstract_params(model_config), mesh=mesh)
  source = assembly.build_source(config, settings.rollout, model, tokenizer)
  inputs, compiled = compile_iteration(model_config, settings, mesh, source, config.seed)
  state, ref, batch, scores = inputs["state"], inputs["ref"], inputs["batch"], inputs["scores"]
  loaded, policy = device_bytes(inputs["policy"]), device_bytes(state.policy)
  frozen = device_bytes(lora.split(model_config, inputs["policy"])[0] or {})  # the base under LoRA adapters
  ref_bytes = device_bytes(ref) if ref is not None else 0
  shared_ref = (ref is not None and settings.model.reference_dtype == model_config.param_dtype
                and not settings.model.reference_path)  # else a copy: cast, or another checkpoint
  # the rollout's token tables stay on the device for the whole run (the source holds them)
  tables = sum(x.nbytes for x in jax.tree.leaves(getattr(source, "assets", None)) if isinstance(x, jax.Array))
  kept = loaded + device_bytes(state) + (0 if shared_ref or ref is None else ref_bytes) + tables  # + trainer.exp's
  held = {"score": kept + device_bytes(batch), "diagnose": kept + device_bytes((batch, scores))}
  held["learn"] = held["diagnose"]
  for name in ("rollout", "prefill", "decode"):  # their other arguments: env states or sampler state, tables
    if name in compiled:
      # the policy's own arrays, or under LoRA a merged copy of the base (`Trainer.rollout_params`): new bytes
      held[name] = kept + compiled[name].memory_analysis().argument_size_in_bytes - tables - (0 if frozen else policy)
  batch_size = settings.update_config().batch_size
  slots = source.seq_len + (settings.rollout.max_new_tokens if not isinstance(source, DeviceSource) else 0)
  memory = {"parameters": policy, "optimizer": device_bytes(state.policy_opt),
            "critic": device_bytes((state.critic, state.critic_opt)), "loaded weights": loaded,
            "reference": 0 if shared_ref else ref_bytes, "KV cache": kv_cache_bytes(model_config, mesh, batch_size,
                                                                                  slots),
            "batch + scores": device_bytes((batch, scores)), "token tables": tables}
  flops = {"rollout": rollout_flops(model_config, source, batch_size)}
  flops |= update_flops(model_config, settings, source.seq_len)
  phases = tuple(_memory(name, c, held[name]) for name, c in compiled.items())
  del compiled
  jax.clear_caches()
  return Plan(model=settings.model.path or BUNDLED_SHAPE,
              num_params=sum(x.size for x in jax.tree.leaves(inputs["policy"])), devices=devices,
              chip=plan_config.chip, mesh=dict(mesh.shape), seq_len=source.seq_len, overrides=overrides,
              memory=memory, phases=phases, flops=flops)


def cheaper_settings(config, plan_config: PlanConfig) -> list[dict]:
  """Overrides to try, cheapest first, each adding to the one before: remat and LM-head chunks (no lost
  throughput), a bfloat16 reference, smaller micro-batches, all devices on fsdp, LoRA adapters of rank
  `LORA_RANK` and then a bfloat16 frozen base; then 2x and 4x the devices, each alone and with all of those."""
  model, train, mesh = config.model, config.train, config.mesh
  steps = []
  if model.remat != "full":
    steps.append({"model.remat": "full"})
  if not model.logits_chunk:
    steps.append({"model.logits_chunk": 512})
  if config.algorithm.use_kl_loss and (model.ref_dtype or model.dtype) != "bfloat16":
    steps.append({"model.ref_dtype": "bfloat16"})
  micro = train.micro_batch_size
  while micro > 1:
    micro //= 2
    steps.append({"train.micro_batch_size": micro})
  if (mesh.data, mesh.fsdp, mesh.tensor) != (1, -1, 1):
    steps.append({"mesh.data": 1, "mesh.fsdp": -1, "mesh.tensor": 1})
  if not model.lora.rank:  # LoRA changes what is trained, so it comes after the settings that do not
    steps.append({"model.lora.rank": LORA_RANK})
  if model.param_dtype != "bfloat16":  # under LoRA the frozen base only (the adapters stay float32)
    steps.append({"model.param_dtype": "bfloat16"})
  ladder, total = [], {}
  for step in steps:
    total = total | step
    ladder.append(total)
  for factor in (2, 4):
    more = {"devices": plan_config.devices * factor}
    ladder += [more, total | more] if total else [more]
  return ladder


def plan_and_fit(config, plan_config: PlanConfig) -> PlanResult:
  """The plan of `config`; when it does not fit and `plan_config.fit`, the plans of `cheaper_settings` in order
  up to the first that fits (rungs needing more devices than this process has are not tried)."""
  first = plan(config, plan_config)
  if first.fits or not plan_config.fit:
    return PlanResult(first)
  tried = []
  for overrides in cheaper_settings(config, plan_config):
    if overrides.get("devices", 0) > jax.device_count():
      break
    tried.append(overrides)
    candidate = plan(config, plan_config, overrides)
    if candidate.fits:
      return PlanResult(first, tuple(tried), candidate)
  return PlanResult(first, tuple(tried))
