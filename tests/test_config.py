"""Config files, overrides, and early failures on misspelt keys and wrong types."""

import os
import subprocess
import sys

import pytest

from ragen_jax import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_check_override_keys_names_the_key_and_suggests():
  config = config_lib.load_config_file(os.path.join(ROOT, "configs/chat.py"))
  config_lib.check_override_keys(config, ["prompt", "mesh.tensor"])
  with pytest.raises(config_lib.ConfigError, match=r"unknown config key 'mesh.tensr'; did you mean 'mesh.tensor'"):
    config_lib.check_override_keys(config, ["mesh.tensr"])


def _run_chat(*args):
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "ragen_jax.chat", "--config=configs/chat.py", *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=120)


def test_entry_point_rejects_misspelt_key_before_work():
  result = _run_chat("--config.max_new_tokns=3")
  assert result.returncode != 0
  assert "unknown config key 'max_new_tokns'; did you mean 'max_new_tokens'" in result.stderr
  assert "Traceback" not in result.stderr


def test_entry_point_rejects_wrong_type():
  result = _run_chat("--config.max_new_tokens=many")
  assert result.returncode != 0
  assert "--config.max_new_tokens=many" in result.stderr
  assert "Traceback" not in result.stderr


def test_override_applies(tmp_path):
  result = _run_chat("--config.max_new_tokens=2", "--config.prompt=Say hi")
  assert result.returncode == 0, result.stderr
  assert "user: Say hi" in result.stdout


@pytest.mark.parametrize("arg", ["sokoban,ppo", "frozenlake,grpo", "countdown,dapo", "math,drgrpo"])
def test_paper_configs_build_their_update_settings(arg):
  from ragen_jax.train import algorithm_from_config
  config = config_lib.load_config_file(os.path.join(ROOT, f"configs/paper/main_table.py:{arg}"))
  env_name, preset = arg.split(",")
  assert (config.train.env_groups, config.train.group_size, config.filter.value) == (8, 16, 0.9)
  assert config.rollout.max_turns == (1 if env_name in ("countdown", "math") else 5)
  algorithm = algorithm_from_config(config.algorithm)
  assert (algorithm.loss.clip_low, algorithm.loss.clip_high, algorithm.loss.entropy_coef) == (0.2, 0.28, 0.001)
  assert algorithm.use_critic == (preset == "ppo") and not algorithm.loss.use_kl_loss


@pytest.mark.parametrize("key,value,message", [("rollout.context_window_mode", "last_turn", "not one of")])
def test_unsupported_settings_fail_before_any_model_is_built(key, value, message):
  from ragen_jax.train import build_experiment
  config = config_lib.load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    build_experiment(config)


def test_limited_context_needs_a_window_of_at_least_one_turn():
  from ragen_jax.train import build_experiment, rollout_config_from
  config = config_lib.load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.rollout.context_window_mode = "limited_multi_turn"
  assert rollout_config_from(config).context_turns == 2
  config.rollout.max_context_window = 0
  with pytest.raises(config_lib.ConfigError, match="max_context_window"):
    build_experiment(config)


@pytest.mark.parametrize("name", ["base", "demo", "compare", "tiny_test", "smollm2_eval", "smollm2_rl"])
def test_config_files_split_their_batch_into_whole_mini_and_micro_batches(name):
  from ragen_jax.rl.update import FilterConfig, UpdateConfig
  from ragen_jax.train import algorithm_from_config
  config = config_lib.load_config_file(os.path.join(ROOT, f"configs/{name}.py"))
  UpdateConfig(algorithm=algorithm_from_config(config.algorithm), filter=FilterConfig(**config.filter.to_dict()),
               num_groups=config.train.env_groups, group_size=config.train.group_size,
               mini_batch_size=config.train.mini_batch_size, micro_batch_size=config.train.micro_batch_size)
