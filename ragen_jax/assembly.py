"""Assembly: a config turned into mesh, model, tokenizer, environment and rollout source.

Entry points (`train`, `evaluate`, `chat`, the demo) build what they need here and never import one
another. `check_model_and_env` validates the `model` and `env` sections (a model directory is checked before
any tensor is read); `build_mesh` and `build_experiment` then load and place everything (nothing is compiled
yet).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import transformers

import envs
from envs import host as host_envs
from envs import text as env_text
from ragen_jax import distributed, paths
from ragen_jax import mesh as mesh_lib
from ragen_jax.config import ENV_PARAMS, ConfigError, check, check_one_of, did_you_mean, parse_text
from ragen_jax.finite import first_nonfinite
from ragen_jax.models import CheckpointError, Model, bundled_model_dir, load_pretrained
from ragen_jax.models import lora as lora_lib
from ragen_jax.models.config import DECODE_LAYERS, DTYPES, REMAT
from ragen_jax.models.gguf_convert import bundled_tokenizer_dir
from ragen_jax.models.hf_io import check_model_dir
from ragen_jax.models.model import adapter_params
from ragen_jax.models.scratch import SCRATCH_TINY, tiny_model
from ragen_jax.rollout.episodes import RolloutConfig, build_assets
from ragen_jax.rollout.source import DeviceSource, RolloutSource, TextSource

ENV_NAMES = tuple(envs.REGISTRY) + tuple(host_envs.REGISTRY)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """The `model` config section: the checkpoint (`path`: a local HF directory, "" the bundled
  SmolLM2-135M-Instruct, `scratch:tiny` the built-in tiny random model) and how it is computed: `dtype`
  (compute), `param_dtype` (weights and optimizer state), `remat` (what the learner's and scorer's backward
  keeps of each layer: none, full, dots), `logits_chunk` (tokens per block of the LM head when scoring;
  0: all at once) and `decode_layers` (scan or unrolled). See `models.config.ModelConfig`. `ref_dtype`: the
  weights of the frozen reference model (the KL loss's), "" = `dtype`; bfloat16 halves a float32 copy. `lora`
  (`models.lora.LoraConfig`, rank 0: off): train LoRA adapters only, the base weights frozen and shared with the
  reference; `adapters`: a PEFT adapter directory (a run's `final_adapters/`) to start from instead of fresh
  adapters. `reference_path`: the KL loss's frozen reference, "" = the policy's starting weights (under LoRA the
  base), else a checkpoint with the policy's shapes and tokenizer (`load_reference`), e.g. a base model whose
  reasoning the run should stay near; it costs one more copy of the weights in `ref_dtype`."""

  path: str = ""
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: str = "none"
  logits_chunk: int = 0
  decode_layers: str = "scan"
  ref_dtype: str = ""
  lora: lora_lib.LoraConfig = lora_lib.LoraConfig()
  adapters: str = ""
  reference_path: str = ""

  def __post_init__(self):
    if isinstance(self.lora, dict):  # the section as a ConfigDict hands it over
      object.__setattr__(self, "lora", lora_lib.LoraConfig(**self.lora))
    check("model.adapters", not self.adapters or self.lora.rank > 0, "needs LoRA (set model.lora.rank and the "
          "alpha and targets the adapters were trained with)", self.adapters)
    check_one_of("model.dtype", self.dtype, DTYPES)
    check_one_of("model.param_dtype", self.param_dtype, DTYPES)
    check_one_of("model.remat", self.remat, REMAT)
    check_one_of("model.decode_layers", self.decode_layers, DECODE_LAYERS)
    check_one_of("model.ref_dtype", self.ref_dtype, ("", *DTYPES))
    check("model.logits_chunk", self.logits_chunk >= 0, "must be >= 0 (0: the whole sequence at once)",
          self.logits_chunk)

  @property
  def reference_dtype(self) -> str:
    return self.ref_dtype or self.dtype

  def computation(self) -> dict:
    """The `ModelConfig` fields these settings fix (everything but the path)."""
    return {"dtype": self.dtype, "param_dtype": self.param_dtype, "remat": self.remat,
            "logits_chunk": self.logits_chunk, "decode_layers": self.decode_layers,
            "lora": self.lora if self.lora.rank else None}


def check_model_and_env(config, env_name: str | None = None) -> None:
  """Validates the `model` section (and the adapter directory it names) and the environment `env_name` (default
  `env.name`) with `env.params`."""
  settings = ModelSettings(**config.model.to_dict())
  check_model_path(settings.path)
  if settings.reference_path:
    check_model_path(settings.reference_path, "model.reference_path")
  if settings.adapters:
    try:
      lora_lib.check_adapter_dir(staged_dir(settings.adapters, "model.adapters"), settings.lora)
    except CheckpointError as error:
      raise ConfigError(f"model.adapters={settings.adapters!r}: {error}") from error
  _environment(config.env.name if env_name is None else env_name, config.env.params.to_dict())


def staged_dir(path: str, key: str, only: tuple[str, ...] | None = None) -> str:
  """The local directory of `path`: itself, or for a `gs://` directory its copy on this host (`paths.staged`:
  copied once, then reused by every process and every later run on the host; `only`: just these files)."""
  try:
    return paths.staged(path, only=only)
  except (OSError, ImportError) as error:
    raise ConfigError(f"{key}={path!r}: cannot copy it to this host ({type(error).__name__}: {error})") from error


def check_model_path(path: str, key: str = "model.path") -> None:
  """Raises ConfigError unless `path` is "" (the bundled model), `scratch:tiny` or a model directory that loads
  (`hf_io.check_model_dir`: config, weights, tokenizer, chat template), local or on `gs://` (staged first)."""
  if path in ("", SCRATCH_TINY):
    return
  if path.startswith("scratch:"):
    raise ConfigError(f"{key}={path!r}: the built-in model is {SCRATCH_TINY!r}")
  try:
    check_model_dir(staged_dir(path, key))
  except CheckpointError as error:
    raise ConfigError(f"{key}={path!r}: {error}") from error


def load_model(path: str, mesh: jax.sharding.Mesh, key: str = "model.path", adapters: str = "",
               **computation) -> tuple[Model, object]:
  """(model on `mesh`, tokenizer) of `path`: an HF directory (local or `gs://`), "" for the bundled
  SmolLM2-135M-Instruct, or `scratch:tiny` (`models.scratch.tiny_model` with the bundled tokenizer).
  `computation`: `ModelConfig` fields (`ModelSettings.computation`); with `lora` the model carries the adapters of
  the PEFT directory `adapters`, or fresh ones. Loaded weights must be finite."""
  check_model_path(path, key)
  adapters = adapters and staged_dir(adapters, "model.adapters")
  try:
    if path == SCRATCH_TINY:
      tokenizer = transformers.AutoTokenizer.from_pretrained(bundled_tokenizer_dir())
      model = tiny_model(tokenizer, mesh, **computation)
      if adapters:
        base = lora_lib.split(model.config, model.params)[0]
        model = dataclasses.replace(model, params=lora_lib.combine(base, adapter_params(model.config, mesh, adapters)))
    else:
      directory = staged_dir(path, key) if path else str(bundled_model_dir())
      tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
      model = load_pretrained(directory, mesh=mesh, adapters=adapters, **computation)
  except CheckpointError as error:
    raise ConfigError(f"{key}={path!r}{f' with adapters {adapters!r}' if adapters else ''}: {error}") from error
  bad = first_nonfinite(model.params)
  if bad:
    raise ConfigError(f"{key}={path!r}: the weights hold NaN or infinite values (first in {bad}); the checkpoint is "
                      f"damaged")
  if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in model.config.eos_token_ids:
    model = dataclasses.replace(model, config=dataclasses.replace(
        model.config, eos_token_ids=model.config.eos_token_ids + (tokenizer.eos_token_id,)))
  return model, tokenizer


def load_reference(settings: ModelSettings, model: Model, tokenizer) -> dict:
  """The weights of the KL reference checkpoint `settings.reference_path` in `model`'s shardings (without LoRA
  adapters), loaded straight in `model.ref_dtype` (no float32 copy on the way to a bfloat16 reference);
  ConfigError unless its parameter shapes and its tokenizer's vocabulary are `model`'s."""
  key = f"model.reference_path={settings.reference_path!r}"
  computation = settings.computation() | {"lora": None, "param_dtype": settings.reference_dtype}
  reference, reference_tokenizer = load_model(settings.reference_path, model.mesh, key="model.reference_path",
                                              **computation)
  shapes = lambda params: jax.tree.map(lambda x: x.shape, params)  # noqa: E731
  if shapes(reference.params) != shapes(lora_lib.split(model.config, model.params)[0] or model.params):
    raise ConfigError(f"{key}: its parameter shapes are not model.path's; the reference must be the same architecture")
  if reference_tokenizer.get_vocab() != tokenizer.get_vocab():
    raise ConfigError(f"{key}: its tokenizer is not model.path's; the KL loss compares the two token by token")
  return reference.params


def env_param_types(name: str) -> dict[str, object]:
  """The type hint of every `env.params` key environment `name` takes (its own parameters; for a host text
  environment its constructor's options, data paths among them)."""
  check_one_of("env.name", name, ENV_NAMES)
  return host_envs.option_types(name) if name in host_envs.REGISTRY else envs.param_types(name)


def _typed_env_params(name: str, overrides: dict) -> dict:
  """`overrides` with command-line text typed by the environment's parameter types; an unknown key raises
  ConfigError naming the closest real ones."""
  param_types = env_param_types(name)
  for key in overrides:
    if key not in param_types:
      raise ConfigError(f"{ENV_PARAMS}.{key}: env {name!r} has no parameter {key!r}"
                        f"{did_you_mean(key, param_types)} (it has {', '.join(param_types)})")
  return {key: parse_text(f"{ENV_PARAMS}.{key}", value, param_types[key]) if isinstance(value, str) else value
          for key, value in overrides.items()}


def _environment(name: str, overrides: dict):
  """(env, env_params) of a pure-JAX environment, or (make_text_env, None) of a host text environment; an
  unknown name or bad params raise ConfigError."""
  overrides = _typed_env_params(name, overrides)
  try:
    if name in host_envs.REGISTRY:
      host_envs.make_text_env(name, **overrides)
      return functools.partial(host_envs.make_text_env, name, **overrides), None
    return envs.make(name, **overrides)
  except (TypeError, ValueError, OSError) as error:  # a host env reads and checks its data files here
    raise ConfigError(f"env.params {overrides} do not fit env {name!r}: {error}") from error


@dataclasses.dataclass
class Experiment:
  """What a config builds before anything runs (every setting already validated)."""

  config: object
  mesh: jax.sharding.Mesh
  model: Model
  tokenizer: object
  source: RolloutSource


def mesh_from_config(section) -> jax.sharding.Mesh:
  """`mesh_lib.mesh_from_config`, its errors as ConfigError naming the `mesh` settings and the devices."""
  count = section.get("num_devices", -1)
  sizes = ", ".join(f"mesh.{axis}={section[axis]}" for axis in mesh_lib.MESH_AXES)
  if count != -1 and not 1 <= count <= jax.device_count():
    raise ConfigError(f"mesh.num_devices={count}: must be -1 (all) or 1..{jax.device_count()}, the devices here")
  try:
    return mesh_lib.mesh_from_config(section)
  except ValueError as error:
    raise ConfigError(f"{sizes}: {error}; set one of them to -1 (the remaining devices)") from error


def build_mesh(config, batch_size: int | None = None) -> jax.sharding.Mesh:
  """The mesh of the `mesh` section; `batch_size` (the training batch) must divide over its batch shards.

  With `distributed.enabled`, first joins the other processes (jax.distributed); the mesh then spans all of them.
  """
  distributed.initialize(config.distributed)
  mesh = mesh_from_config(config.mesh)
  shards = mesh_lib.batch_shards(mesh)
  if batch_size is not None and batch_size % shards:
    raise ConfigError(f"the batch of {batch_size} episodes does not divide over {shards} data x fsdp shards of the "
                      f"mesh")
  if jax.process_count() > 1 and mesh.size != jax.device_count():
    raise ConfigError(f"mesh.num_devices={config.mesh.num_devices}: with {jax.process_count()} processes the mesh "
                      f"must span all {jax.device_count()} devices (-1)")
  return mesh


def check_process_split(mesh: jax.sharding.Mesh, key: str, episodes: int) -> None:
  """With several processes each plays its own share of a rollout's `episodes` (`mesh.process_rows`): raises a
  ConfigError naming `key` when they do not divide over the mesh's data x fsdp shards."""
  shards = mesh_lib.batch_shards(mesh)
  if jax.process_count() > 1 and episodes % shards:
    raise ConfigError(f"{key}: {episodes} episodes do not divide over {shards} data x fsdp shards of the mesh "
                      f"(needed with {jax.process_count()} processes)")


def build_experiment(config, rollout: RolloutConfig, mesh: jax.sharding.Mesh,
                     env_name: str | None = None) -> Experiment:
  """Model, tokenizer and the rollout source of `env_name` (default `env.name`) on `mesh` (`build_mesh`);
  the settings were validated first (`check_model_and_env`)."""
  name = config.env.name if env_name is None else env_name
  settings = ModelSettings(**config.model.to_dict())
  model, tokenizer = load_model(settings.path, mesh, adapters=settings.adapters, **settings.computation())
  source = build_source(config, rollout, model, tokenizer, name)
  return Experiment(config=config, mesh=mesh, model=model, tokenizer=tokenizer, source=source)


def build_source(config, rollout: RolloutConfig, model: Model, tokenizer, env_name: str | None = None) -> RolloutSource:
  """The rollout source of `env_name` (default `env.name`) for `model` on its mesh (only its config and mesh are
  read here: its params may be abstract, as the plan command's are). The sampler decodes with LoRA adapters merged
  into the weights (`lora.merge`: `bench/sampler.py` measured it faster than the adapters in the forward), so the
  source's model has no adapters and `run` takes merged weights."""
  name = config.env.name if env_name is None else env_name
  env, env_params = _environment(name, config.env.params.to_dict())
  model = dataclasses.replace(model, config=lora_lib.without(model.config))
  if name in host_envs.REGISTRY:
    return TextSource(model=model, tokenizer=tokenizer, vocab=env_text.Vocab(tokenizer).table, make_env=env,
                      config=rollout)
  assets = build_assets(tokenizer, env, env_params, rollout, table_size=model.config.vocab_size)
  return DeviceSource(model_config=model.config, env=env, env_params=env_params, assets=assets, config=rollout,
                      mesh=model.mesh)

