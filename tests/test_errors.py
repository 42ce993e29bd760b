"""Every mistake a user can make at the command line ends in one line `error: ...`, a non-zero exit and no
traceback: settings, the config file, the workdir, model directories, env.params, checkpoints, halted runs.

The cases run as the real entry points (`config.run` of train, evaluate and chat: flag parsing, validation,
`sys.exit` at the interpreter's top level), each in a process forked from one driver that imported them once,
so the many cases cost one import. Two more start `python -m ragen_jax.train` as a user would.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ragen_jax import config as config_lib
from ragen_jax.assembly import check_model_and_env
from ragen_jax.models.scratch import save_scratch_model
from tests.conftest import FAST_COMPILE_FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Forks one child per case; a child runs the entry point with the case's argv, its stdout and stderr in a file,
# and ends as that entry point ends (SystemExit reaching the top level, like `python -m ragen_jax.train`). The
# imported objects are frozen out of the garbage collector first: a child's collections at exit would otherwise
# touch, and so copy, every page of them (1.3 s a child, 0.4 s frozen).
DRIVER = r"""
import gc, json, os, sys
from ragen_jax import chat, evaluate, train
from ragen_jax import config as config_lib
cases, out_dir = json.loads(sys.argv[1]), sys.argv[2]
gc.freeze()
mains = {"train": train.main, "evaluate": evaluate.main, "chat": chat.main}
codes = []
for i, (entry, argv) in enumerate(cases):
  pid = os.fork()
  if pid == 0:
    fd = os.open(os.path.join(out_dir, f"{i}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = [f"ragen_jax.{entry}", *argv]
    config_lib.run(mains[entry])
    sys.exit(0)  # not reached: absl's app.run always ends in sys.exit
  codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""


def _run_cases(cases, tmp_path):
  """[(exit code, output)] of each (entry point, argv) case."""
  out_dir = tmp_path / "outputs"
  out_dir.mkdir()
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(cases), str(out_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=True)
  codes = json.loads(result.stdout.strip().splitlines()[-1])
  return [(code, (out_dir / f"{i}.txt").read_text()) for i, code in enumerate(codes)]


def _assert_one_line_error(code, output, expected):
  lines = [line for line in output.splitlines() if line.strip()]
  assert code != 0, output
  assert "Traceback" not in output, output
  assert lines and lines[-1].startswith("error: "), output  # the message is the last line, and one line
  assert expected in lines[-1], (expected, lines[-1])


@pytest.fixture(scope="module")
def small_model_dir(tokenizer, tmp_path_factory):
  """A 2-layer random model with the test tokenizer (chat template included): a directory that loads."""
  path = tmp_path_factory.mktemp("small_model")
  save_scratch_model(tokenizer, path, hidden_size=32)
  return path


def _model_dirs(small_model_dir, root):
  """Model directories with one thing wrong each, by name."""
  def copy(name, drop=(), edit_config=None):
    path = root / name
    shutil.copytree(small_model_dir, path, ignore=shutil.ignore_patterns(*drop))
    if edit_config:
      config = json.loads((path / "config.json").read_text())
      (path / "config.json").write_text(json.dumps({**config, **edit_config}))
    return path

  dirs = {"empty": root / "empty", "file": root / "weights.bin"}
  dirs["empty"].mkdir()
  dirs["file"].write_bytes(b"\0")
  dirs["no_weights"] = copy("no_weights", drop=("*.safetensors",))
  dirs["no_tokenizer"] = copy("no_tokenizer", drop=("tokenizer*",))
  dirs["no_chat_template"] = copy("no_chat_template", drop=("chat_template*",))
  dirs["falcon"] = copy("falcon", edit_config={"model_type": "falcon"})
  dirs["nan_weights"] = copy("nan_weights")
  tensors = load_file(dirs["nan_weights"] / "model.safetensors")
  tensors["model.layers.1.mlp.down_proj.weight"][0, 0] = np.nan
  save_file(tensors, dirs["nan_weights"] / "model.safetensors", metadata={"format": "pt"})
  run = root / "run"  # what a training run leaves: checkpoints/<step>/ (Orbax) and final_model/
  (run / "checkpoints" / "4").mkdir(parents=True)
  (run / "checkpoints" / "4" / "_CHECKPOINT_METADATA").write_text("{}")
  (run / "checkpoints" / "4" / "commit_success.txt").write_text("ok")
  dirs.update(run=run, step=run / "checkpoints" / "4")
  return dirs


def test_every_user_mistake_ends_in_one_line_error(small_model_dir, tmp_path):
  dirs = _model_dirs(small_model_dir, tmp_path)
  no_get_config = tmp_path / "no_get_config.py"
  no_get_config.write_text("SETTINGS = {}\n")
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  base = ["--config=configs/tiny_test.py", f"--config.model.path={small_model_dir}",
          "--config.logging.tensorboard=False"]
  train_cases = [  # (overrides, what the error line says); each case in its own workdir
      (["--config.algorithm.preset=ppo2"], "algorithm.preset='ppo2' is not one of 'ppo', 'grpo', 'dapo', 'drgrpo'"),
      (["--config.env.name=sokobon"], "env.name='sokobon' is not one of 'sokoban', 'frozenlake', 'bandit', "
                                      "'lightsout', 'countdown', 'math', 'code'"),
      (["--config.rollout.context_window_mode=all"], "rollout.context_window_mode='all' is not one of 'full'"),
      (["--config.filter.strategy=top_q"], "filter.strategy='top_q' is not one of 'top_p'"),
      (["--config.mesh.data=3"], "mesh.data=3, mesh.fsdp=1, mesh.tensor=1: mesh sizes (3, 1, 1) do not divide the "
                                 "8 devices"),
      (["--config.mesh.num_devices=9"], "mesh.num_devices=9: must be -1 (all) or 1..8"),
      (["--config.train.group_size=3"], "must divide the batch of 6 episodes"),
      (["--config.train.iterations=-1"], "train.iterations=-1: must be >= 1"),
      (["--config.train.val_episodes=-8"], "train.val_episodes=-8: must be >= 1"),
      (["--config.train.group_size=0"], "train.group_size=0: must be >= 1"),
      (["--config.rollout.temperature=-1"], "rollout.temperature=-1.0: must be >= 0"),
      (["--config.rollout.top_p=1.5"], "rollout.top_p=1.5: must be in (0, 1]"),
      (["--config.train.iteratons=3"], "unknown config key 'train.iteratons'; did you mean 'train.iterations'"),
      (["--config.train.iterations=many"], "--config.train.iterations=many"),
      ([f"--config.workdir={a_file}"], f"workdir='{a_file}': {a_file} is a file, not a directory"),
      ([f"--config.workdir={a_file}/run"], f"{a_file} is a file, not a directory"),
      (["--config.env.params.num_boxs=2"], "env.params.num_boxs: env 'sokoban' has no parameter 'num_boxs'; did you "
                                           "mean 'num_boxes'"),
      (["--config.env.params.num_boxes=two"], "env.params.num_boxes='two': must be an int"),
      (["--config.env.params.num_boxes", "2.5"], "env.params.num_boxes='2.5': must be an int"),  # flag, space, value
      (["--config.env.params.dim_room=7"], "env.params.dim_room='7': needs 2 comma-separated values"),
      (["--config.env.params.size=1", "--config.env.name=frozenlake"], "frozenlake: size must be >= 2"),
      (["--config.env.name=math", f"--config.env.params.path={tmp_path}/absent.jsonl"],
       f"math problem file not found: {tmp_path}/absent.jsonl"),
      (["--config.env.name=code", "--config.env.params.isolation=none"], "isolation must be 'auto', 'namespaces' or "
                                                                         "'basic', got 'none'"),
      (["--config.model.path=scratch:huge"], "model.path='scratch:huge': the built-in model is 'scratch:tiny'"),
      ([f"--config.model.path={tmp_path}/absent"], f"model.path='{tmp_path}/absent': no such directory"),
      ([f"--config.model.path={dirs['file']}"], "a file; give the Hugging Face model directory that holds config.json"),
      ([f"--config.model.path={dirs['empty']}"], "no config.json: not a Hugging Face model directory"),
      ([f"--config.model.path={dirs['no_weights']}"], "no *.safetensors weights"),
      ([f"--config.model.path={dirs['no_tokenizer']}"], "no tokenizer files (tokenizer.json, tokenizer.model, "
                                                         "vocab.json)"),
      ([f"--config.model.path={dirs['no_chat_template']}"], "the tokenizer has no chat template"),
      ([f"--config.model.path={dirs['falcon']}"], "config.json: model_type 'falcon' is not supported; use one of"),
      ([f"--config.model.path={dirs['step']}"], f"an Orbax training checkpoint (one step), not a Hugging Face model "
                                                f"directory; load the run's exported policy {dirs['run']}/final_model"),
      ([f"--config.model.path={dirs['run']}"], f"a training run directory, not a model directory; load its exported "
                                               f"policy {dirs['run']}/final_model"),
      ([f"--config.model.path={dirs['nan_weights']}"], "hold NaN or infinite values (first in ['layers']['down_proj']"),
      (["--config.model.lora.rank=-2"], "model.lora.rank=-2: must be >= 0 (0: no adapters, full fine-tuning)"),
      (["--config.model.lora.rank=4", "--config.model.lora.dropout=0.1"], "model.lora.dropout=0.1: only 0 is "
                                                                           "supported"),
      ([f"--config.model.adapters={tmp_path}"], f"model.adapters='{tmp_path}': needs LoRA (set model.lora.rank"),
      (["--config.model.lora.rank=4", f"--config.model.adapters={tmp_path}"],
       f"model.adapters='{tmp_path}': {tmp_path} is not a LoRA adapter directory"),
      ([f"--config.workdir={dirs['run']}", "--config.train.resume=False"],
       f"workdir='{dirs['run']}' holds an earlier run (checkpoints): set train.overwrite=True"),
      ([f"--config.workdir={dirs['run']}"], "none of the 1 checkpoints in "),  # resumed by default
  ]
  cases = [("train", base + args if any(a.startswith("--config.workdir=") for a in args) else
            base + [f"--config.workdir={tmp_path}/w{i}"] + args) for i, (args, _) in enumerate(train_cases)]
  expected = [message for _, message in train_cases]
  other_cases = [
      (("train", []), "--config=configs/NAME.py is required"),
      (("train", ["--config=configs/tiny_tset.py"]), "--config=configs/tiny_tset.py: no such config file; did you "
                                                     "mean 'configs/tiny_test.py'?"),
      (("train", [f"--config={no_get_config}"]), "the file defines no get_config()"),
      (("evaluate", base + ["--config.evaluate.envs=sokoban,chess"]), "env.name='chess' is not one of"),
      (("evaluate", base + ["--config.evaluate.k=0"]), "evaluate.k=0: must be >= 1"),
      (("evaluate", base + [f"--config.model.path={dirs['step']}"]), "an Orbax training checkpoint"),
      (("chat", ["--config=configs/chat.py", f"--config.model_path={tmp_path}/absent"]),
       f"model_path='{tmp_path}/absent': no such directory"),
  ]
  cases += [case for case, _ in other_cases]
  expected += [message for _, message in other_cases]
  for (code, output), message in zip(_run_cases(cases, tmp_path), expected, strict=True):
    _assert_one_line_error(code, output, message)
  assert os.listdir(dirs["run"] / "checkpoints") == ["4"]  # the refused and the failed resume moved nothing


def _train(*args, timeout=300, **env_vars):
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu", **env_vars}
  return subprocess.run([sys.executable, "-m", "ragen_jax.train", "--config=configs/tiny_test.py",
                         "--config.logging.tensorboard=False", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_a_run_whose_updates_all_blow_up_halts_with_one_line(small_model_dir, tmp_path):
  result = _train(f"--config.model.path={small_model_dir}", f"--config.workdir={tmp_path}",
                  "--config.train.actor_lr=1e30", "--config.train.critic_lr=1e30",
                  "--config.train.max_rejected_updates=1", "--config.train.val_every=0",
                  "--config.filter.enabled=False",  # keep the groups whose episodes all score alike
                  XLA_FLAGS=FAST_COMPILE_FLAGS)
  _assert_one_line_error(result.returncode, result.stdout + result.stderr,
                         "1 optimizer steps in a row had a non-finite loss or gradient norm and were not applied "
                         "(train.max_rejected_updates=1); the weights are those of the last finite step, no "
                         "checkpoint was saved yet")
  assert not (tmp_path / "final_model").exists()  # nothing non-finite exported
  report = (tmp_path / "report.md").read_text()  # the iteration it logged is reported, with why it halted
  assert "The run halted at iteration 1: 1 optimizer steps in a row had a non-finite loss" in report


def test_tiny_test_runs_with_nothing_prepared_and_takes_env_params(tmp_path):
  # configs/tiny_test.py as a newcomer runs it (one CPU device): the built-in scratch:tiny model; Sokoban resized
  # from the command line; one iteration (the last one validates)
  result = _train(f"--config.workdir={tmp_path}", "--config.env.params.dim_room=5,5",
                  "--config.env.params.num_boxes=2", "--config.train.iterations=1", XLA_FLAGS=FAST_COMPILE_FLAGS,
                  RAGEN_JAX_CACHE=str(tmp_path / "cache"))  # the bundled tokenizer written fresh, as on a new machine
  assert result.returncode == 0, result.stderr[-3000:]
  assert "model: scratch:tiny, a random model (2 layers, hidden 64) with the bundled SmolLM2 tokenizer" in result.stderr
  assert (tmp_path / "final_model" / "model.safetensors").is_file() and (tmp_path / "report.md").is_file()
  first = json.loads((tmp_path / "transcripts.jsonl").read_text().splitlines()[0])
  assert "Board size: 5 rows x 5 cols" in first["turns"][0]["prompt"]


@pytest.mark.parametrize("hint,text,value", [
    (int, " 12", 12), (float, "-0.05", -0.05), (float, "1e-3", 1e-3), (str, "/data/a b.jsonl", "/data/a b.jsonl"),
    (bool, "False", False), (bool, "1", True), (int | None, "none", None), (int | None, "7", 7),
    (tuple[int, int], "7,7", (7, 7)), (tuple[int, int], "(5, 6)", (5, 6)), (tuple[int, ...], "[1,2,3]", (1, 2, 3)),
])
def test_command_line_text_is_typed_by_the_parameter_type(hint, text, value):
  parsed = config_lib.parse_text("env.params.x", text, hint)
  assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("hint,text,message", [
    (int, "1.5", "must be an int"), (float, "fast", "must be a number"), (bool, "yes please", "must be true or false"),
    (tuple[int, int], "7", "needs 2 comma-separated values"), (tuple[int, int], "7,x", "must be an int"),
    (dict, "{}", "holds a dict and cannot be set from the command line"),
])
def test_text_that_does_not_fit_the_type_names_the_key(hint, text, message):
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.parse_text("env.params.x", text, hint)
  assert str(error.value).startswith("env.params.x") and message in str(error.value)


def test_env_params_reach_every_env_including_host_data_paths(tmp_path):
  config = config_lib.load_config_file(os.path.join(ROOT, "configs/tiny_test.py"))
  config.env.params = {"dim_room": "5,5", "step_penalty": "-0.5"}  # as text, the way the command line gives them
  check_model_and_env(config)
  config.env.name = "lightsout"
  config.env.params = {"size": "4", "shaped_reward": "false"}
  check_model_and_env(config)
  train_file, validation_file = tmp_path / "train.jsonl", tmp_path / "validation.jsonl"
  train_file.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "#### 4"}) + "\n")
  validation_file.write_text(json.dumps({"question": "What is 3 + 3?", "answer": "#### 6"}) + "\n")
  config.env.name = "math"
  config.env.params = {"path": str(train_file), "validation_path": str(validation_file),
                       "data_dir": str(tmp_path / "data")}
  check_model_and_env(config)
  config.env.params = {"path": str(train_file), "validation_fraction": "1.5", "data_dir": str(tmp_path / "data")}
  with pytest.raises(config_lib.ConfigError, match=r"validation_fraction must be in \[0, 1\), got 1.5"):
    check_model_and_env(config)
