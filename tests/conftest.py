"""Test set-up: 8 fake CPU devices so sharded code is tested against 1 device, and shared fixtures."""
import os

# Test speed only: LLVM compiles XLA:CPU's elementwise kernels unoptimized (-O0), and XLA:CPU emits its fusions
# with its older emitters, which -O0 makes fast (the newer MLIR fusion emitters still optimize their kernels). The
# suite's tiny programs take far longer to compile than to run: the two flags cut a tiny run's compile time from
# 42 s to 12 s (-O0 alone: 24 s; the older emitters alone: 46 s). XLA's HLO passes, shardings and memory plans are
# the same; float results may differ in the last bit (the multi-process tests keep the newer emitters:
# tests/test_multihost.py). Runs and benchmarks keep XLA's defaults: at the demo's size -O0 runs 2-3x slower.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# pylint: disable=wrong-import-position
import dataclasses
import gc
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs
from ragen_jax import host_memory
from ragen_jax import mesh as mesh_lib
from ragen_jax.models import Model, init_params
from ragen_jax.models.gguf_convert import bundled_model_dir
from ragen_jax.models.scratch import scratch_config
from ragen_jax.models.tokenizer import train_tokenizer
from ragen_jax.rollout import prompt
from ragen_jax.rollout.episodes import RolloutConfig, build_assets, render_batch, reset_batch, unbatch
from ragen_jax.sft import fit, lr_schedule

host_memory.reuse_freed_memory()  # as the entry points do, before JAX starts its CPU client


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
  """Drops JAX's in-memory caches of compiled programs after each test module: XLA:CPU maps each executable's code
  in many memory maps (a trainer's programs take thousands), the caches keep them alive, and a worker running half
  the suite would pass the kernel's default limit of 65,530 maps (LLVM then aborts the worker). Later modules
  reload what they share from the persistent compilation cache below."""
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
  """One persistent XLA compilation cache per test run, shared by the xdist workers: the many tests that
  build the same tiny trainer (every one with fresh jits) compile each program once. Test speed only."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the run's directory, above each worker's own
  jax.config.update("jax_compilation_cache_dir", str(root / "xla_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
  """HF directory of the bundled SmolLM2, converted fresh into a session temp cache (never a stale one)."""
  return bundled_model_dir(tmp_path_factory.mktemp("ragen_jax_cache"))


REPLY = "push on</think><answer>Up || Left</answer>"
OTHER_REPLIES = ("go down</think><answer>Down</answer>", "go right</think><answer>Right</answer>")


@pytest.fixture(scope="session")
def sokoban():
  return envs.make("sokoban")


@pytest.fixture(scope="session")
def sokoban_states(sokoban):
  """First states of Sokoban seeds 0-39 (one reset compilation for the fixtures below)."""
  env, params = sokoban
  return reset_batch(env, params, jnp.arange(40))


@pytest.fixture(scope="session")
def tokenizer(sokoban, sokoban_states):
  env, params = sokoban
  host_states = jax.device_get(sokoban_states)
  texts = [env.render_text(unbatch(host_states, i), params) for i in range(40)]
  texts += [env.instruction_text(params, 10), prompt.FORMAT_REMINDER, "Reward:\n-0.1\nTurn 2:\nState:\n", REPLY] * 20
  return train_tokenizer(texts, vocab_size=1000)


@pytest.fixture(scope="session")
def greedy_config():
  return RolloutConfig(max_turns=3, max_new_tokens=16, temperature=0.0)


@pytest.fixture(scope="session")
def assets(tokenizer, sokoban, greedy_config):
  env, params = sokoban
  return build_assets(tokenizer, env, params, greedy_config, table_size=scratch_config(tokenizer).vocab_size)


@pytest.fixture(scope="session")
def replying_model(tokenizer, sokoban, sokoban_states, assets):
  """A 2-layer model fine-tuned to answer turns with REPLY (60%, so greedy decoding picks it) or one of
  OTHER_REPLIES (so sampled episodes of a group differ in score)."""
  env, env_params = sokoban
  config = scratch_config(tokenizer, hidden_size=64)
  replies = [tokenizer.encode(r) + [tokenizer.eos_token_id] for r in (REPLY,) * 3 + OTHER_REPLIES]
  obs_ids, obs_len = render_batch(env, env_params, assets.observation, sokoban_states)
  ids, valid = jax.jit(jax.vmap(prompt.first_chunk, in_axes=(None, 0, 0, None)))(assets.turns, obs_ids, obs_len, 10)
  examples = []
  for i, (row_ids, row_valid) in enumerate(zip(np.asarray(ids)[:16], np.asarray(valid)[:16])):
    context, reply = row_ids[row_valid].tolist(), replies[i % len(replies)]
    examples.append((context + reply, [False] * len(context) + [True] * len(reply)))
  params, loss = fit(config, init_params(config, jax.random.key(0)), [(examples, 512, 100)], batch_size=4,
                     schedule=lr_schedule(5e-3, 100))
  assert loss < 0.5, loss
  return Model(config=dataclasses.replace(config, eos_token_ids=(tokenizer.eos_token_id,)), params=params,
               mesh=mesh_lib.single_device_mesh())


@pytest.fixture(scope="session")
def replying_model_dir(replying_model, tokenizer, tmp_path_factory):
  """The replying model exported as a HF directory with its tokenizer."""
  return pathlib.Path(replying_model.export(tmp_path_factory.mktemp("replying_model"), tokenizer))
