"""Config files, overrides, and early failures on misspelt keys and wrong types."""

import dataclasses
import os
import subprocess
import sys

import pytest

from ragen_jax import config as config_lib
from ragen_jax.assembly import ModelSettings
from ragen_jax.diagnostics.collapse import CollapseConfig
from ragen_jax.rl.early_stop import EarlyStopConfig
from ragen_jax.rl.presets import AlgorithmConfig
from ragen_jax.rl.snr_filter import FilterConfig
from ragen_jax.rollout.episodes import RolloutConfig
from ragen_jax.trainer import TrainConfig, Trainer, read_settings

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
  config = config_lib.load_config_file(os.path.join(ROOT, f"configs/paper/main_table.py:{arg}"))
  env_name, preset = arg.split(",")
  assert (config.train.env_groups, config.train.group_size, config.filter.value) == (8, 16, 0.9)
  assert config.rollout.max_turns == (1 if env_name in ("countdown", "math") else 5)
  config.model.path = "scratch:tiny"  # its placeholder path to the 3B checkpoint is not on this machine
  algorithm = read_settings(config).algorithm
  assert (algorithm.loss.clip_low, algorithm.loss.clip_high, algorithm.loss.entropy_coef) == (0.2, 0.28, 0.001)
  assert algorithm.use_critic == (preset == "ppo") and not algorithm.loss.use_kl_loss


def _tiny_config_without_a_model():
  """The tiny test config; its model (scratch:tiny) is only made once the settings pass, which these tests
  never reach."""
  return config_lib.load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))


# Every enumerated setting, with the values it allows (written out here, not read from the code).
ENUMERATED = {
    "filter.metric": ("variance", "std"),
    "filter.strategy": ("top_p", "top_k", "top_k_abs", "min_p"),
    "filter.filter_type": ("largest", "smallest"),
    "filter.prob_mode": ("linear", "softmax"),
    "filter.loss_scaling": ("none", "linear", "sqrt"),
    "algorithm.preset": ("ppo", "grpo", "dapo", "drgrpo"),
    "algorithm.kl_estimator": ("kl", "low_var_kl", "mse"),
    "algorithm.loss_agg_scope": ("mini_batch", "micro_batch"),
    "diagnostics.marginal": ("paper", "code"),
    "diagnostics.bucket_mode": ("quantile", "fixed"),
    "rollout.context_window_mode": ("full", "limited_multi_turn", "single_turn"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.param_dtype": ("float32", "bfloat16", "float16"),
    "model.decode_layers": ("scan", "unrolled"),
    "env.name": ("sokoban", "frozenlake", "countdown", "math"),
}


@pytest.mark.parametrize("key", sorted(ENUMERATED))
def test_misspelt_enumerated_settings_fail_before_any_model_is_loaded(key):
  config = _tiny_config_without_a_model()
  section, name = key.split(".")
  config[section][name] = ENUMERATED[key][0] + "x"
  with pytest.raises(config_lib.ConfigError) as error:
    Trainer.create(config)
  message = str(error.value)
  assert "\n" not in message and message.startswith(f"{key}={ENUMERATED[key][0] + 'x'!r} is not one of")
  assert all(repr(value) in message for value in ENUMERATED[key]), message


@pytest.mark.parametrize("key,value,message", [
    ("filter.value", 0.0, "filter.value=0.0: must be positive"),
    ("train.micro_batch_size", 3, "train.micro_batch_size=3: must divide train.mini_batch_size=4"),
    ("diagnostics.alarm_window", 1, "diagnostics.alarm_window=1: must cover at least 2 points"),
    ("early_stop.std_window", 0, "early_stop.std_window=0: must be >= 1"),
    ("algorithm.dual_clip", 1.0, "algorithm.dual_clip=1.0: must be > 1"),
    ("train.overwrite", True, "train.overwrite=True: deletes the earlier run for a fresh one; set train.resume=False"),
    ("train.profile_steps", (0, 1), r"train.profile_steps=\(0, 1\): iterations to trace, each >= 1"),
])
def test_bad_values_fail_before_any_model_is_loaded(key, value, message):
  config = _tiny_config_without_a_model()
  section, name = key.split(".")
  config[section][name] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    Trainer.create(config)


def test_entry_point_reports_a_bad_setting_in_one_line():
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-m", "ragen_jax.train", "--config=configs/tiny_test.py",
                           "--config.model.path=/nonexistent/model", "--config.filter.strategy=top_q"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1].startswith("error: filter.strategy='top_q' is not one of 'top_p'")
  assert "Traceback" not in result.stderr


def test_limited_context_needs_a_window_of_at_least_one_turn():
  config = _tiny_config_without_a_model()
  config.rollout.context_window_mode = "limited_multi_turn"
  assert read_settings(config).rollout.context_turns == 2
  config.rollout.max_context_window = 0
  with pytest.raises(config_lib.ConfigError, match="max_context_window"):
    Trainer.create(config)


@pytest.mark.parametrize("name", ["base", "demo", "compare", "tiny_test", "smollm2_eval", "smollm2_rl"])
def test_config_files_hold_valid_settings(name):
  config = config_lib.load_config_file(os.path.join(ROOT, f"configs/{name}.py"))
  update = read_settings(config).update_config()  # among others: whole mini and micro batches
  assert update.batch_size % update.mini_batch_size == 0 and update.mini_batch_size % update.micro_batch_size == 0


def test_base_config_takes_its_defaults_from_the_section_dataclasses():
  config = config_lib.load_config_file(os.path.join(ROOT, "configs/base.py"))
  for section, config_class in [("model", ModelSettings), ("rollout", RolloutConfig), ("train", TrainConfig),
                                ("algorithm", AlgorithmConfig), ("filter", FilterConfig),
                                ("diagnostics", CollapseConfig), ("early_stop", EarlyStopConfig)]:
    assert config[section].to_dict() == dataclasses.asdict(config_class()), section
