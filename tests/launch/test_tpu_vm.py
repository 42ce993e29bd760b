"""`launch.tpu_vm --dry-run`: the exact gcloud commands, argument by argument; quoting; early errors.

Nothing is sent anywhere: every test goes through --dry-run and parses the printed
lines back (shlex for the local line, a POSIX-shell tokenizer for the command sent
to the workers and the restart loop it starts).
"""

import pytest

from launch import commands, tpu_vm
from ragen_jax import config as config_lib
from tests.launch.conftest import HOSTILE, shell_words

ZONE = "--zone=us-central2-b"
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu", "--zone=us-central2-b"]
TRAIN_CONFIG = "configs/tiny_test.py"  # a training config: `run` checks it here as the trainer does
HOSTILE_SETTING = f"logging.wandb_project={HOSTILE}"  # a free-text setting


def remote_command(argv):
  """The `--command=` of one `tpu-vm ssh` argv, split as the worker's shell splits it."""
  assert argv[:len(SSH)] == SSH
  assert argv[-1].startswith("--command=")
  return shell_words(argv[-1].removeprefix("--command="))


def test_create_queued_resource(dry_run):
  plan = dry_run(tpu_vm.main, "create", "my-tpu", ZONE, "--accelerator-type=v4-8", "--project=my-project-1",
                 "--spot", "--service-account=runner@my-project-1.iam.gserviceaccount.com")
  assert plan == [["gcloud", "compute", "tpus", "queued-resources", "create", "my-tpu", "--node-id=my-tpu",
                   "--zone=us-central2-b", "--accelerator-type=v4-8", "--runtime-version=tpu-ubuntu2204-base",
                   "--project=my-project-1", "--spot",
                   "--service-account=runner@my-project-1.iam.gserviceaccount.com"]]


@pytest.mark.parametrize("accelerator, runtime", [
    ("v4-8", "tpu-ubuntu2204-base"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5p-64", "v2-alpha-tpuv5"),
    ("v6e-8", "v2-alpha-tpuv6e"),
])
def test_create_picks_the_documented_runtime(dry_run, accelerator, runtime):
  (argv,) = dry_run(tpu_vm.main, "create", "my-tpu", ZONE, f"--accelerator-type={accelerator}", "--reserved")
  assert argv[-3:] == [f"--accelerator-type={accelerator}", f"--runtime-version={runtime}", "--reserved"]


def test_create_explicit_runtime(dry_run):
  (argv,) = dry_run(tpu_vm.main, "create", "my-tpu", ZONE, "--accelerator-type=v4-8",
                    "--runtime-version=tpu-vm-v4-base")
  assert argv[-1] == "--runtime-version=tpu-vm-v4-base"


@pytest.mark.parametrize("accelerator, message", [
    ("v5e-16", "gcloud calls v5e 'v5litepod'; use v5litepod-16"),
    ("v4", "expected GENERATION-SIZE"),
    ("v4-0", "expected GENERATION-SIZE"),
    ("v4-eight", "expected GENERATION-SIZE"),
    ("tpu-8", "expected GENERATION-SIZE"),
])
def test_create_rejects_bad_accelerator_type(usage_error, accelerator, message):
  err = usage_error(tpu_vm.main, "create", "my-tpu", ZONE, f"--accelerator-type={accelerator}")
  assert "argument --accelerator-type" in err and message in err


def test_create_spot_and_reserved_exclude_each_other(usage_error):
  err = usage_error(tpu_vm.main, "create", "my-tpu", ZONE, "--accelerator-type=v4-8", "--spot", "--reserved")
  assert "not allowed with argument --spot" in err


@pytest.mark.parametrize("argv, message", [
    (["status", "my-tpu"], "the following arguments are required: --zone"),
    (["status", "my-tpu", "--zone=us central2"], "expected a zone like us-central2-b"),
    (["status", "My_TPU", ZONE], "a TPU name is 1-63 lowercase letters"),
    (["status", "my-tpu", ZONE, "--project=x; rm"], "expected a project ID"),
    (["logs", "my-tpu", ZONE, "--worker=first"], "expected 'all' or a worker index"),
    (["setup", "my-tpu", ZONE, "--python=python3.10"], "python3.11 or newer"),
    (["setup", "my-tpu", ZONE, "--remote-dir=~/ragen_jax"], "relative to the home directory"),
    (["setup", "my-tpu", ZONE, "--ref=--upload-pack=evil"], "not starting with '-'"),
])
def test_early_argument_errors(usage_error, argv, message):
  assert message in usage_error(tpu_vm.main, *argv)


def test_status_and_delete(dry_run):
  assert dry_run(tpu_vm.main, "status", "my-tpu", ZONE) == [
      ["gcloud", "compute", "tpus", "queued-resources", "describe", "my-tpu", "--zone=us-central2-b"]]
  assert dry_run(tpu_vm.main, "delete", "my-tpu", ZONE, "--project=my-project-1") == [
      ["gcloud", "compute", "tpus", "queued-resources", "delete", "my-tpu", "--zone=us-central2-b",
       "--project=my-project-1", "--force", "--quiet"]]


def test_setup_copies_the_checkout_then_installs_the_tpu_extra(dry_run, tmp_path, monkeypatch):
  monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
  archive = str(tmp_path / "ragen_jax-my-tpu.tar.gz")
  tools, pack, copy, unpack, install = dry_run(tpu_vm.main, "setup", "my-tpu", ZONE)
  assert remote_command(tools) == [
      "command", "-v", "python3.11", ">", "/dev/null", "&&", "command", "-v", "make", ">", "/dev/null", "||",
      "(", "sudo", "apt-get", "update", "-qq", "&&", "sudo", "env", "DEBIAN_FRONTEND=noninteractive",
      "apt-get", "install", "-y", "-qq", "python3.11", "python3.11-venv", "make", ")"]
  assert tools[len(SSH)] == "--worker=all"
  assert pack == ["git", "-C", str(commands.ROOT), "archive", "--format=tar.gz", f"--output={archive}", "HEAD"]
  assert copy == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive, "my-tpu:ragen_jax-src.tar.gz",
                  "--zone=us-central2-b", "--worker=all"]
  assert remote_command(unpack) == ["mkdir", "-p", "ragen_jax", "&&", "tar", "-xzf", "ragen_jax-src.tar.gz",
                                    "-C", "ragen_jax", "&&", "rm", "ragen_jax-src.tar.gz"]
  assert remote_command(install) == [
      "cd", "ragen_jax", "&&", "make", "install", "PY=python3.11", "&&",
      ".venv/bin/pip", "install", "--quiet", "--disable-pip-version-check", "-r", "launch/requirements-tpu.txt"]
  assert all(argv[len(SSH)] == "--worker=all" for argv in (unpack, install))


def test_setup_clones_a_url_at_a_ref_quoted(dry_run):
  url, ref = "https://example.com/me/ragen jax.git", "fix; rm -rf ~"
  _, clone, _ = dry_run(tpu_vm.main, "setup", "my-tpu", ZONE, f"--repo-url={url}", f"--ref={ref}",
                        "--remote-dir=work dir")
  assert remote_command(clone) == [
      "(", "test", "-d", "work dir/.git", "||", "git", "clone", "--quiet", url, "work dir", ")", "&&",
      "git", "-C", "work dir", "fetch", "--quiet", "origin", ref, "&&",
      "git", "-C", "work dir", "checkout", "--quiet", "--detach", "FETCH_HEAD"]


def _run_words(*extra):
  return ["my-tpu", ZONE, f"--config={TRAIN_CONFIG}", "--workdir=gs://my-bucket/runs/a", *extra]


def _loop_and_rest(words):
  """(the restart loop's script, the words after it) of a worker command that starts `sh -c LOOP`."""
  at = words.index("sh")
  assert words[at + 1] == "-c"
  return words[at + 2], words[at + 3:]


def _train_words(loop):
  """The trainer's argv inside the restart loop, as `sh -c` splits it."""
  words = shell_words(loop)
  return words[words.index("do") + 1:words.index("code=$?") - 1]


def test_run_trains_on_all_workers_in_a_restart_loop_and_streams_the_log(dry_run):
  (argv,) = dry_run(tpu_vm.main, "run", *_run_words("--mesh-preset=v5e-16", f"--override={HOSTILE_SETTING}",
                                                    "--env=TPU_STDERR_LOG_LEVEL=0", "--max-restarts=7"))
  assert argv[len(SSH)] == "--worker=all"
  words = remote_command(argv)
  assert words[:words.index("sh")] == ["cd", "ragen_jax", "&&", "mkdir", "-p", "logs", "&&", "set", "-o",
                                       "pipefail", "&&"]
  loop, rest = _loop_and_rest(words)
  assert rest == ["2", ">&", "1", "|", "tee", "-a", "logs/train.log"]
  train = ["env", "TPU_STDERR_LOG_LEVEL=0", ".venv/bin/python", "-m", "ragen_jax.train", f"--config={TRAIN_CONFIG}",
           "--config.distributed.enabled=True", "--config.mesh.data=1", "--config.mesh.fsdp=16",
           "--config.mesh.tensor=1", "--config.workdir=gs://my-bucket/runs/a", f"--config.{HOSTILE_SETTING}"]
  assert loop == commands.restart_loop(train, max_restarts=7)
  assert _train_words(loop) == train


def test_run_detached_writes_log_and_process_group(dry_run):
  (argv,) = dry_run(tpu_vm.main, "run", *_run_words("--detach", "--remote-dir=/opt/ragen jax"))
  words = remote_command(argv)
  assert words[:words.index("sh")] == ["cd", "/opt/ragen jax", "&&", "mkdir", "-p", "logs", "&&", "{", "setsid",
                                       "nohup"]
  loop, rest = _loop_and_rest(words)
  assert _train_words(loop)[:3] == [".venv/bin/python", "-m", "ragen_jax.train"]
  assert "-ge 100 ]" in loop  # --max-restarts defaults to 100
  assert rest == [">>", "logs/train.log", "2", ">&", "1", "<", "/dev/null", "&", "echo", "$!", ">", "logs/train.pid",
                  ";", "}"]


def test_run_flags_set_the_intended_config_values_through_three_shells(dry_run):
  """The words the worker's `sh -c` passes to the trainer, parsed by the trainer's parser, give back every value."""
  (argv,) = dry_run(tpu_vm.main, "run", *_run_words("--mesh-preset=v5e-16", "--tensor=4",
                                                    f"--override={HOSTILE_SETTING}",
                                                    "--override=rollout.max_new_tokens=7"))
  train = _train_words(_loop_and_rest(remote_command(argv))[0])
  assert train[train.index("ragen_jax.train") + 1] == f"--config={TRAIN_CONFIG}"
  parsed = config_lib.parse_config(["train", f"--config={commands.ROOT / TRAIN_CONFIG}",
                                    *train[train.index("ragen_jax.train") + 2:]])
  assert parsed.logging.wandb_project == HOSTILE and parsed.rollout.max_new_tokens == 7
  assert parsed.distributed.enabled is True and parsed.workdir == "gs://my-bucket/runs/a"
  assert (parsed.mesh.data, parsed.mesh.fsdp, parsed.mesh.tensor) == (1, 4, 4)


def test_run_checks_the_config_here_with_the_trainers_own_message(capsys):
  """A misspelt key stops the dry run before any command, with the line the trainer's parser gives
  (`config.parse_flags`, what `python -m ragen_jax.train` parses with: tests/test_errors.py runs it)."""
  override = "train.iteratons=3"
  with pytest.raises(SystemExit) as train_exit:
    config_lib.parse_config(["ragen_jax.train", f"--config={commands.ROOT / TRAIN_CONFIG}", f"--config.{override}"])
  with pytest.raises(SystemExit) as run_exit:
    tpu_vm.main(["run", "--dry-run", *_run_words(f"--override={override}")])
  assert capsys.readouterr().out == ""
  assert run_exit.value.code == train_exit.value.code == (
      "error: unknown config key 'train.iteratons'; did you mean 'train.iterations' or 'train.actor_lr' or "
      "'train.beta2'?")


@pytest.mark.parametrize("override, message", [
    ("rollout.max_new_tokens=many", "error: flag --config.rollout.max_new_tokens=many: invalid literal for int()"),
    ("filter.strategy=best", "error: filter.strategy='best' is not one of"),
    ("model.adapters=gs://my-bucket/adapters", "error: model.adapters='gs://my-bucket/adapters': needs LoRA"),
])
def test_run_rejects_values_the_trainer_rejects(override, message):
  with pytest.raises(SystemExit) as exit_info:
    tpu_vm.main(["run", "--dry-run", *_run_words(f"--override={override}")])
  assert exit_info.value.code.startswith(message)


def test_run_leaves_model_files_to_the_workers(dry_run):
  (argv,) = dry_run(tpu_vm.main, "run", *_run_words("--override=model.path=gs://my-bucket/models/qwen"))
  assert "--config.model.path=gs://my-bucket/models/qwen" in _train_words(_loop_and_rest(remote_command(argv))[0])


@pytest.mark.parametrize("extra, message", [
    (["--override=mesh.fsdp=2", "--mesh-preset=v4-8"], "config key 'mesh.fsdp' is set twice"),
    (["--override=distributed.enabled=False"], "config key 'distributed.enabled' is set twice"),
    (["--override=workdir=/tmp/x"], "config key 'workdir' is set twice"),
    (["--override=no_equals_sign"], "expected KEY=VALUE"),
    (["--override=bad key=1"], "expected KEY=VALUE"),
    (["--override=prompt=two\nlines"], "line breaks cannot pass"),
    (["--env=1BAD=x"], "expected NAME=VALUE"),
    (["--mesh-preset=v5e-12"], "unknown mesh preset 'v5e-12'; known: cpu, gpu1, gpu8, v4-8, "),
    (["--mesh-preset=v5e-16", "--tensor=3"], "--tensor=3 must divide the preset's 16 devices"),
    (["--tensor=2"], "--tensor needs --mesh-preset"),
    (["--max-restarts=-1"], "expected an integer >= 0"),
])
def test_run_rejects_bad_settings(usage_error, extra, message):
  assert message in usage_error(tpu_vm.main, "run", *_run_words(*extra))


@pytest.mark.parametrize("argv, message", [
    (["--config=configs/missing.py", "--workdir=gs://my-bucket/a"], "no such config file"),
    (["--config=/abs/configs/chat.py", "--workdir=gs://my-bucket/a"], "relative to the repo root"),
    ([f"--config={TRAIN_CONFIG}", "--workdir=/tmp/run"], "expected gs://BUCKET[/PATH]"),
    ([f"--config={TRAIN_CONFIG}"], "the following arguments are required: --workdir"),
])
def test_run_checks_config_and_workdir(usage_error, argv, message):
  assert message in usage_error(tpu_vm.main, "run", "my-tpu", ZONE, *argv)


def test_tensorboard_reads_the_run_directory_from_gcs(dry_run, usage_error):
  assert dry_run(tpu_vm.main, "tensorboard", "--logdir=gs://my-bucket/runs/a", "--port=6007") == [
      ["tensorboard", "--logdir=gs://my-bucket/runs/a", "--port=6007"]]
  assert "expected gs://BUCKET[/PATH]" in usage_error(tpu_vm.main, "tensorboard", "--logdir=runs/a")


def test_exec_runs_one_quoted_command(dry_run):
  (argv,) = dry_run(tpu_vm.main, "exec", "my-tpu", ZONE, "--worker=3", "--", "ls", "-la", HOSTILE)
  assert argv[len(SSH)] == "--worker=3"
  assert remote_command(argv) == ["ls", "-la", HOSTILE]


def test_logs_tails_worker_zero_by_default(dry_run):
  (argv,) = dry_run(tpu_vm.main, "logs", "my-tpu", ZONE)
  assert argv == [*SSH, "--worker=0", "--command=tail -n 100 ragen_jax/logs/train.log"]
  (argv,) = dry_run(tpu_vm.main, "logs", "my-tpu", ZONE, "--worker=all", "--follow", "--lines=5")
  assert argv == [*SSH, "--worker=all", "--command=tail -n 5 -F ragen_jax/logs/train.log"]


def test_copy_results_rsyncs_from_worker_zero(dry_run):
  (argv,) = dry_run(tpu_vm.main, "copy-results", "my-tpu", ZONE, "--run-dir=runs/my run",
                    "--dest=gs://my-bucket/results/a")
  assert argv[len(SSH)] == "--worker=0"
  assert remote_command(argv) == ["cd", "ragen_jax", "&&", "gcloud", "storage", "rsync", "--recursive",
                                  "runs/my run", "gs://my-bucket/results/a"]


def test_copy_results_needs_a_gcs_destination(usage_error):
  err = usage_error(tpu_vm.main, "copy-results", "my-tpu", ZONE, "--run-dir=logs", "--dest=/home/me/results")
  assert "expected gs://BUCKET[/PATH]" in err
