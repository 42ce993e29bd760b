"""`launch.gpu --dry-run`: install order, the trainer command on local GPUs, multi-host env, early errors."""

import pytest

from launch import commands, gpu
from tests.launch.conftest import HOSTILE

TRAIN = [".venv/bin/python", "-m", "ragen_jax.train", "--config=configs/chat.py"]


def test_install_pins_cpu_env_then_cuda_extra(dry_run):
  assert dry_run(gpu.main, "install", "--python=python3.12") == [
      ["cd", str(commands.ROOT)],
      ["make", "install", "PY=python3.12"],
      [".venv/bin/pip", "install", "--quiet", "--disable-pip-version-check", "-r", "launch/requirements-gpu.txt"]]


def test_run_on_eight_local_gpus(dry_run):
  assert dry_run(gpu.main, "run", "--config=configs/chat.py", "--mesh-preset=gpu8", "--workdir=runs/a b",
                 f"--override=prompt={HOSTILE}") == [
      ["cd", str(commands.ROOT)],
      [*TRAIN, "--config.mesh.data=1", "--config.mesh.fsdp=8", "--config.mesh.tensor=1",
       "--config.workdir=runs/a b", f"--config.prompt={HOSTILE}"]]


def test_run_one_of_two_hosts(dry_run):
  _, argv = dry_run(gpu.main, "run", "--config=configs/chat.py", "--gpus=0,1,2,3", "--coordinator=10.0.0.2:8476",
                    "--num-processes=2", "--process-id=1", "--mesh-preset=gpu8", "--env=NCCL_DEBUG=WARN")
  assert argv == ["env", "CUDA_VISIBLE_DEVICES=0,1,2,3", "RAGEN_COORDINATOR=10.0.0.2:8476", "RAGEN_NUM_PROCESSES=2",
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
])
def test_run_rejects_inconsistent_arguments(usage_error, argv, message):
  assert message in usage_error(gpu.main, "run", "--config=configs/chat.py", *argv)
