"""`launch.gpu --dry-run`: install order, the trainer in its restart loop on local GPUs, multi-host env, early
errors, and the config checked here as the trainer checks it."""

import pytest

from launch import commands, gpu
from tests.launch.conftest import HOSTILE, shell_words

CONFIG = "configs/tiny_test.py"
TRAIN = [".venv/bin/python", "-m", "ragen_jax.train", f"--config={CONFIG}"]


def _train_in_loop(argv, max_restarts=100):
  """The trainer's argv of a `sh -c LOOP` command, checked to be `commands.restart_loop` of it."""
  assert argv[:2] == ["sh", "-c"] and len(argv) == 3
  words = shell_words(argv[2])
  train = words[words.index("do") + 1:words.index("code=$?") - 1]
  assert argv[2] == commands.restart_loop(train, max_restarts)
  return train


def test_install_pins_cpu_env_then_cuda_extra(dry_run):
  assert dry_run(gpu.main, "install", "--python=python3.12") == [
      ["cd", str(commands.ROOT)],
      ["make", "install", "PY=python3.12"],
      [".venv/bin/pip", "install", "--quiet", "--disable-pip-version-check", "-r", "launch/requirements-gpu.txt"]]


def test_run_on_eight_local_gpus(dry_run):
  cd, loop = dry_run(gpu.main, "run", f"--config={CONFIG}", "--mesh-preset=gpu8", "--tensor=2", "--workdir=runs/a b",
                     f"--override=logging.wandb_project={HOSTILE}", "--max-restarts=3")
  assert cd == ["cd", str(commands.ROOT)]
  assert _train_in_loop(loop, max_restarts=3) == [
      *TRAIN, "--config.mesh.data=1", "--config.mesh.fsdp=4", "--config.mesh.tensor=2", "--config.workdir=runs/a b",
      f"--config.logging.wandb_project={HOSTILE}"]


def test_run_one_of_two_hosts(dry_run):
  _, loop = dry_run(gpu.main, "run", f"--config={CONFIG}", "--gpus=0,1,2,3", "--coordinator=10.0.0.2:8476",
                    "--num-processes=2", "--process-id=1", "--mesh-preset=gpu8", "--env=NCCL_DEBUG=WARN")
  assert _train_in_loop(loop) == [
      "env", "CUDA_VISIBLE_DEVICES=0,1,2,3", "RAGEN_COORDINATOR=10.0.0.2:8476", "RAGEN_NUM_PROCESSES=2",
      "RAGEN_PROCESS_ID=1", "NCCL_DEBUG=WARN", *TRAIN, "--config.distributed.enabled=True",
      "--config.mesh.data=1", "--config.mesh.fsdp=8", "--config.mesh.tensor=1"]


@pytest.mark.parametrize("argv, message", [
    (["--mesh-preset=gpu8", "--gpus=0,1"], "'gpu8' expects 8 GPUs in all, --gpus and --num-processes give 2"),
    (["--gpus=0,0"], "expected distinct GPU indices"),
    (["--coordinator=10.0.0.2:8476"], "--coordinator, --num-processes and --process-id go together"),
    (["--coordinator=10.0.0.2", "--num-processes=2", "--process-id=0"], "expected HOST:PORT"),
    (["--coordinator=h:1", "--num-processes=2", "--process-id=2"], "--process-id 2 must be below --num-processes 2"),
    (["--process-id=-1"], "expected an integer >= 0"),
    (["--override=mesh.data=2", "--mesh-preset=gpu1"], "config key 'mesh.data' is set twice"),
    (["--mesh-preset=gpu8", "--tensor=3"], "--tensor=3 must divide the preset's 8 devices"),
])
def test_run_rejects_inconsistent_arguments(usage_error, argv, message):
  assert message in usage_error(gpu.main, "run", f"--config={CONFIG}", *argv)


def test_run_checks_the_model_directory_here(tmp_path):
  """The job runs on this host, so its files are checked here, as the trainer checks them."""
  with pytest.raises(SystemExit) as exit_info:
    gpu.main(["run", "--dry-run", f"--config={CONFIG}", f"--override=model.path={tmp_path}"])
  assert exit_info.value.code.startswith(f"error: model.path={str(tmp_path)!r}: ")
