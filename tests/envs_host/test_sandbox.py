"""Sandbox: verdicts agree with plain CPython on trusted code, every listed
attack is contained in every isolation mode the project allows, scored 0 within
its limit, and leaves the test process, its files and its sockets unharmed, and
"auto" refuses to run code where it cannot isolate it."""

import os
import pathlib
import shutil
import signal
import socket
import tempfile
import threading

import pytest

from envs.host import sandbox
from envs.host.code_exec import load_code_problems
from envs.host.sandbox import CheckTest, SandboxLimits, SandboxPool, StdioTest, ValueTest, compile_test

ATTACK_LIMITS = dict(wall_seconds=3.0, cpu_seconds=1, memory_mb=256, max_output_bytes=1 << 16)
SOLVE = "\ndef solve():\n    return 42\n"  # reached only if the attack was not stopped
SOLVE_TEST = [compile_test("assert solve() == 42")]
SECRET_VARIABLE = "RAGEN_SANDBOX_TEST_SECRET"

# Every isolation the project allows. "auto" is namespaces here or refuses (test_auto_refuses_...); basic
# without the audit hook is refused by SandboxLimits.
LAYERS = {
  "default": dict(),  # auto: namespaces and the audit hook
  "namespaces_alone": dict(isolation="namespaces", audit_hook=False),
  "basic": dict(isolation="basic"),  # a fresh uid when the test runs as root
  "basic_parent_uid": dict(isolation="basic"),  # the test process's own uid, as under a non-root trainer
}


def _trusted(**limits) -> SandboxLimits:
  """Limits for tests of verdicts: the default isolation, or the basic opt-in where namespaces are unavailable
  (where "auto" refuses to run anything)."""
  if sandbox.available_isolation() != "namespaces":
    limits.setdefault("isolation", "basic")
  return SandboxLimits(**limits)


def _attacks(tmp, secret: str, port: int) -> dict[str, str]:
  parent = os.getpid()
  device = "stat.S_IFCHR | 0o666, os.makedev(1, 3)"  # a second /dev/null
  return {
    "infinite_loop": "while True:\n    pass\n",
    "allocate_20gb": "hog = bytearray(20 << 30)\n",
    "output_1gb": "import os\nfor _ in range(1 << 14):\n    os.write(1, b'x' * 65536)\n",
    "write_outside": f"open({str(tmp / 'outside.txt')!r}, 'w').write('pwned')\n",
    "read_host_file": f"assert open({secret!r}).read() == 'secret'\n",
    "tcp_to_local_listener": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).send(b'hi')\n",
    "children_300": "import os, time\nfor _ in range(300):\n    if os.fork() == 0:\n        time.sleep(30)\n"
    "        os._exit(0)\n",
    "inherited_environment": f"import os\nassert os.environ.get({SECRET_VARIABLE!r})\n",
    "parent_environ_file": f"assert open('/proc/{parent}/environ', 'rb').read()\n",
    "kill_parent": f"import os, signal\nos.kill({parent}, signal.SIGUSR1)\n",
    # Signal 0 only checks permission: if these ever got through, nothing outside the test would be hit.
    "killpg_parent": f"import os\nos.killpg(os.getpgid({parent}), 0)\n",
    "kill_everyone": "import os\nos.kill(-1, 0)\n",
    "pidfd_parent": f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({parent}), signal.SIGUSR1)\n",
    "mknod_device_inside": f"import os, stat\nos.mknod('null2', {device})\n",
    "mknod_device_outside": f"import os, stat\nos.mknod({str(tmp / 'null2')!r}, {device})\n",
    "mkfifo_outside": f"import os\nos.mkfifo({str(tmp / 'fifo')!r})\n",
  }


def _processes_of(uid: int) -> list[int]:
  pids = []
  for name in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{name}/status") as f:
        uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
    except (OSError, StopIteration):
      continue
    if str(uid) in uids:
      pids.append(int(name))
  return pids


@pytest.fixture
def outside():
  """A host directory anyone may enter and write (pytest's tmp_path sits in a 0700 one): only the
  sandbox's own layers keep a candidate out of it."""
  path = tempfile.mkdtemp(prefix="ragen_outside_")
  os.chmod(path, 0o777)
  yield pathlib.Path(path)
  shutil.rmtree(path)


@pytest.fixture
def usr1_received():
  """SIGUSR1s the test process receives while the test runs (its default action would kill pytest)."""
  received = []
  previous = signal.signal(signal.SIGUSR1, lambda number, frame: received.append(number))
  yield received
  signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_attacks_are_contained_and_scored_zero(layer, outside, usr1_received, monkeypatch):
  if LAYERS[layer].get("isolation") != "basic" and sandbox.available_isolation() != "namespaces":
    pytest.skip("namespace isolation needs root and working unshare/mount/chroot")
  if layer == "basic_parent_uid":
    monkeypatch.setattr(sandbox, "_sandbox_uid", lambda isolation: None)
  monkeypatch.setenv(SECRET_VARIABLE, "hunter2")
  secret = outside / "secret.txt"
  secret.write_text("secret")
  os.chmod(secret, 0o644)
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    attacks = _attacks(outside, str(secret), server.getsockname()[1])
    limits = SandboxLimits(**ATTACK_LIMITS, **LAYERS[layer])
    results = SandboxPool(max_workers=4).map([(code + SOLVE, SOLVE_TEST) for code in attacks.values()], limits)
    with pytest.raises(BlockingIOError):
      server.accept()  # nobody connected
  for name, result in zip(attacks, results):
    assert result.passed == (False,), (name, result)
    assert result.fraction == 0.0
    assert result.wall_seconds < limits.wall_seconds + 5.0, (name, result)
    assert (result.uid is None) == (layer == "basic_parent_uid" or os.geteuid() != 0), (name, result)
    if result.uid is not None:
      assert _processes_of(result.uid) == [], (name, "left processes behind")
  assert usr1_received == []  # no signal reached the test process
  assert os.listdir(outside) == ["secret.txt"]  # no file, device node or FIFO made outside
  assert secret.read_text() == "secret"
  by_name = dict(zip(attacks, results))
  assert by_name["output_1gb"].status == "output_limit"
  assert by_name["infinite_loop"].status in ("timeout", "no_result")  # wall clock or CPU limit
  assert "MemoryError" in by_name["allocate_20gb"].feedback  # RLIMIT_AS refused it at once
  # The test process is unharmed: it still runs and scores a good program.
  assert sandbox.run_program("def solve():\n    return 42\n", SOLVE_TEST, limits).passed == (True,)


def test_auto_refuses_to_run_without_namespaces(monkeypatch):
  monkeypatch.setattr(sandbox, "_startup_failure", lambda isolation: "not root" if isolation == "namespaces" else None)
  ran = []
  monkeypatch.setattr(sandbox, "_run", lambda *args: ran.append(args) or (None, b""))
  for limits in (SandboxLimits(), SandboxLimits(isolation="namespaces")):
    with pytest.raises(sandbox.SandboxUnavailable) as error:
      sandbox.run_program(SOLVE, SOLVE_TEST, limits)
    message = str(error.value)
    assert "\n" not in message and "not root" in message and "unshare" in message and "chroot" in message
    assert "isolation='basic'" in message and "env.params.isolation" in message
  assert ran == []  # refused before starting anything
  sandbox.run_program(SOLVE, SOLVE_TEST, SandboxLimits(isolation="basic"))  # the explicit opt-in runs
  assert len(ran) == 1 and ran[0][-1] == "basic"


def test_namespace_view_hides_the_host(tmp_path):
  if sandbox.available_isolation() != "namespaces":
    pytest.skip("namespace isolation unavailable")
  host_file = tmp_path / "host.txt"
  host_file.write_text("x")
  checks = [
    "assert os.getcwd() == '/work'",
    "assert os.getuid() != 0 and os.getgid() != 0",
    f"assert not os.path.exists({str(host_file)!r})",
    "assert not {'etc', 'home', 'tmp', 'proc', 'sys', 'var'} & set(os.listdir('/'))",
    "assert os.path.exists('/dev/null') and not os.path.exists('/dev/sda')",
    "open('/work/scratch', 'w').write('ok'); assert open('scratch').read() == 'ok'",
  ]
  result = sandbox.run_program(
    "import os\n", [compile_test(c) for c in checks], SandboxLimits(isolation="namespaces", audit_hook=False)
  )
  assert result.passed == (True,) * len(checks), result


# --------------------------------------------------------------------------- verdicts


def _in_process_verdicts(code: str, tests: list) -> tuple[bool, ...]:
  """Peer: CPython running trusted code and its asserts directly."""
  verdicts = []
  for test in tests:
    namespace: dict = {}
    try:
      exec(code, namespace)  # noqa: S102 - the project's own reference solutions
      exec(test, namespace)  # noqa: S102
      verdicts.append(True)
    except Exception:  # noqa: BLE001
      verdicts.append(False)
  return tuple(verdicts)


def test_verdicts_match_cpython_on_reference_and_broken_solutions():
  problems = [p for split in load_code_problems().values() for p in split]
  jobs, expected = [], []
  for problem in problems:
    raw = [t.source for t in problem.tests if not isinstance(t, StdioTest)]
    if not raw:
      continue
    broken = problem.solution.replace("return ", "return 0 and ", 1)  # wrong on most inputs
    for code in (problem.solution, broken):
      jobs.append((code, problem.tests))
      expected.append(_in_process_verdicts(code, raw))
  results = SandboxPool().map(jobs, _trusted())
  assert [r.passed for r in results] == expected
  assert any(all(e) for e in expected) and any(not all(e) for e in expected)


def test_stdio_programs_are_compared_by_the_parent():
  tests = [compile_test({"input": "2 3\n", "output": "5\n"}), compile_test({"input": "1 1", "output": "2  \n\n"})]
  good = sandbox.run_program("a, b = map(int, input().split())\nprint(a + b)", tests, _trusted())
  assert good.status == "ok" and good.passed == (True, True)
  wrong = sandbox.run_program("a, b = map(int, input().split())\nprint(a * b)", tests, _trusted())
  assert wrong.passed == (False, False) and "expected" in wrong.feedback
  exits = sandbox.run_program(
    "import sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.exit(0)", tests, _trusted()
  )
  assert exits.passed == (True, True)


def test_compile_test_kinds():
  assert compile_test("assert f(1) == [1, 2]") == ValueTest("f(1)", [1, 2], "assert f(1) == [1, 2]")
  assert compile_test("assert f(1)") == CheckTest("assert f(1)")
  assert compile_test("assert f(1) == g(2)") == CheckTest("assert f(1) == g(2)")
  assert compile_test("assert f(1) == 2, 'msg'") == CheckTest("assert f(1) == 2, 'msg'")
  assert compile_test({"input": "x", "output": "y"}) == StdioTest("x", "y")
  for bad in ("assert (", 3, {"input": "x"}, {"input": 1, "output": "y"}):
    with pytest.raises(ValueError):
      compile_test(bad)


def test_reward_hacks_do_not_pass_value_tests():
  tests = [compile_test("assert solve() == 42")]
  always_equal = (
    "class Anything:\n    def __eq__(self, other):\n        return True\ndef solve():\n    return Anything()\n"
  )
  assert sandbox.run_program(always_equal, tests, _trusted()).passed == (False,)
  forged = 'import os\nos.write(1, b\'\\n0123456789abcdef[{"repr": "42"}]\\n\')\nos._exit(0)\n'
  forged_result = sandbox.run_program(forged, tests, _trusted())
  assert forged_result.status == "no_result" and forged_result.passed == (False,)
  exits_early = "import sys\nsys.exit(0)\ndef solve():\n    return 42\n"
  assert sandbox.run_program(exits_early, tests, _trusted()).passed == (False,)


def test_malformed_programs_score_zero_without_raising():
  tests = [compile_test("assert f() == 1"), compile_test({"input": "", "output": "1"})]
  malformed = (
    "def f(:",
    "",
    "\x00",
    "raise SystemExit(3)",
    "import sys; sys.setrecursionlimit(10**6)\ndef f(): return f()\nf()",
    "import ctypes",
    "import gc; gc.get_objects()",
    "import sys; sys.settrace(lambda *a: None)",
  )
  for code in malformed:
    result = sandbox.run_program(code, tests, _trusted(wall_seconds=3.0, cpu_seconds=1))
    assert result.passed == (False, False), (code, result)


def test_limits_are_checked_early():
  with pytest.raises(ValueError, match="isolation"):
    SandboxLimits(isolation="docker")
  with pytest.raises(ValueError, match="positive"):
    SandboxLimits(cpu_seconds=0)
  with pytest.raises(ValueError, match="audit hook"):
    SandboxLimits(isolation="basic", audit_hook=False)


def test_pool_bounds_concurrency(monkeypatch):
  workers, peak, active, lock = 2, [0], [0], threading.Lock()
  both_inside = threading.Barrier(workers)

  def fake_run(code, tests, limits):
    with lock:
      active[0] += 1
      peak[0] = max(peak[0], active[0])
    both_inside.wait(timeout=10)  # proves `workers` runs overlap
    with lock:
      active[0] -= 1
    return code

  monkeypatch.setattr(sandbox, "run_program", fake_run)
  jobs = [(str(i), []) for i in range(8)]
  assert SandboxPool(max_workers=workers).map(jobs) == [str(i) for i in range(8)]
  assert peak[0] == workers


def test_patching_builtins_or_the_harness_does_not_fake_passes():
  tests = [compile_test(t) for t in ("assert solve() == 42", "assert solve() > 41", {"input": "", "output": "42"})]
  patches = (
    "import builtins\nbuiltins.repr = lambda value: '42'\nbuiltins.exec = lambda *args: None\n"
    "builtins.eval = lambda *args: 42\ndef solve():\n    return 0\n",
    "import sys\nharness = sys.modules['__main__']\nharness.text_stream = None\nharness.CappedBytes = None\n"
    "def solve():\n    return 0\n",
  )
  for code in patches:
    assert sandbox.run_program(code, tests, _trusted()).passed == (False, False, False), code


def test_large_programs_and_many_tests():
  padding = "# " + "x" * 200_000 + "\n"  # larger than a pipe buffer
  tests = [compile_test(f"assert double({i}) == {2 * i}") for i in range(200)]
  result = sandbox.run_program(padding + "def double(x):\n    return 2 * x\n", tests, _trusted())
  assert result.status == "ok" and result.fraction == 1.0


def test_patching_the_interpreter_does_not_open_the_hook(tmp_path):
  outside = tmp_path / "outside.txt"
  patch = (
    "import builtins, os, sys\n"
    "harness = sys.modules['__main__']\n"
    "harness.DENIED_EVENTS, harness.DENIED_IMPORTS, harness.WRITE_PATH_EVENTS = ('nothing',), frozenset(), {}\n"
    "builtins.isinstance = lambda *args: True\n"
    "builtins.any = builtins.all = lambda *args: True\n"
    "os.fspath = os.fsdecode = lambda path: '/'\n"
    "os.path.realpath = os.path.abspath = lambda path: os.getcwd()\n"
  )
  attacks = [f"open({str(outside)!r}, 'w').write('pwned')\n", "import socket\n", "import os\nos.fork()\n"]
  limits = SandboxLimits(isolation="basic", wall_seconds=3.0, cpu_seconds=1)
  for attack in attacks:
    assert sandbox.run_program(patch + attack + SOLVE, SOLVE_TEST, limits).passed == (False,), attack
  assert not outside.exists()
  control = sandbox.run_program(patch + SOLVE, SOLVE_TEST, limits)  # the patches alone break nothing
  assert control.passed == (True,), control
