"""Running untrusted candidate programs: one sandboxed process per candidate.

`run_program(code, tests, limits)` starts `python -I -S -B` (isolated, no
site-packages, no bytecode writes) on `sandbox_seccomp.py`, which installs a
seccomp filter and execs the same on `sandbox_harness.py`, and returns a
`SandboxResult`; `SandboxPool` bounds how many run at once. Whatever the
candidate does, the caller gets a result: hangs, crashes, floods and refused
operations all come back as a status with no tests passed.

Isolation modes (`SandboxLimits.isolation`); the code never runs unconfined:

* "auto" (the default): "namespaces" when a probe candidate runs in them here
  (probed once per process), and otherwise `SandboxUnavailable` at once,
  before any candidate runs (the code env raises it when it is built, so a
  training run stops at start). Untrusted code never silently gets less.
* "namespaces": needs root, util-linux `unshare` and `mount`, coreutils
  `chroot`, and permission to create namespaces (CAP_SYS_ADMIN in a
  container). A fresh network namespace (a downed loopback only), PID, IPC,
  UTS and mount namespaces, and a chroot into a tmpfs holding only read-only,
  nosuid, nodev binds of the interpreter and system library directories,
  `/dev/{null,zero,urandom}` and a size-capped tmpfs `/work` (the cwd), run as
  a fresh uid. Guarantees, with or without the audit hook: no network, no host
  file outside those directories exists for the candidate (so no host file
  can be read, written or replaced), the trainer and every other host process
  are invisible (no /proc; another PID namespace) and cannot be signalled,
  RLIMIT_NPROC counts only the candidate's processes, and killing the
  namespace's first process kills every process in it.
* "basic" (explicit opt-in only, where namespaces are unavailable): the
  candidate runs in the host's file system, network and PID space, confined
  by the layers below. When the parent is root it runs as a fresh uid (so it
  cannot signal, trace or change the trainer, create device nodes, or write
  files other users cannot write; RLIMIT_NPROC applies). When the parent is
  not root no uid can be dropped: the candidate has the trainer's uid, so file
  permissions do not separate them, and RLIMIT_NPROC is not set (it would
  count the trainer's own processes); new processes are refused by the
  seccomp filter and the hook instead. Either way, what the candidate may
  read and write on the host (only the work directory, the stdlib and three
  /dev files) is enforced by the audit hook, which C-level code could get
  round (a fresh uid backs it up only for files other users cannot read or
  write); the network and other processes stay closed by the kernel (the
  seccomp filter). Basic mode needs the audit hook (`audit_hook=False` is
  refused).

Layers, outermost first (every mode has all but the namespaces):

* The namespaces above.
* A fresh uid (random, above 2^20, not in /etc/passwd) with no supplementary
  groups, when the parent is root.
* A seccomp filter (`sandbox_seccomp.py`, kernel-enforced, with
  no_new_privs): no signals, pidfds, tracing or limit/priority changes aimed
  at any other process, no mknod/mkfifo, no new processes (threads only), no
  sockets, no io_uring. These are exactly the holes the audit hook cannot see.
* Resource limits, soft = hard: RLIMIT_CPU (SIGKILL one second past it),
  RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC (fresh uid only), no
  core files.
* An audit hook (`sandbox_harness.make_audit_hook`) that refuses sockets,
  process creation, signals, ctypes, frame introspection and file access
  outside the work directory. Audit hooks are not a security boundary by
  themselves (C extensions can go around them); no ctypes is loaded in the
  candidate's process, and the kernel layers above do not depend on the hook.
* The parent: a wall-clock deadline, stdout read through a cap, and SIGKILL
  to the process group (and so the PID namespace) when the run ends, however
  it ends; then it kills any live process left in the sandbox's session or
  with its uid (a process that left the session, in basic mode) before
  returning. The candidate's environment is empty (HOME and TMPDIR only).

Expected answers never enter the sandbox: `value` and `stdio` tests send the
candidate's value repr / stdout back and are compared here, so a candidate
cannot pass them by faking the result line or by returning an object whose
`__eq__` always says True. `check` tests (asserts that are not `expr ==
literal`) are judged inside the candidate's process and can be faked by a
candidate that subverts the interpreter.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import secrets
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HARNESS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_harness.py")
SECCOMP_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_seccomp.py")
NAMESPACE_WORKDIR = "/work"
_UID_BASE, _UID_SPAN = 1 << 20, 1 << 30


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Limits for one candidate run (all tests of one candidate share them)."""

  wall_seconds: float = 5.0
  cpu_seconds: int = 2
  memory_mb: int = 512  # address space (RLIMIT_AS)
  file_size_mb: int = 8  # largest file it may write (RLIMIT_FSIZE)
  work_dir_mb: int = 16  # size of the tmpfs work directory (namespaces only)
  max_processes: int = 16  # RLIMIT_NPROC of the sandbox uid (namespaces; basic when the parent is root)
  max_open_files: int = 64
  max_output_bytes: int = 1 << 20  # bytes of stdout the parent reads before killing it
  max_test_output: int = 64 << 10  # captured stdout per stdio test, value repr, candidate prints
  isolation: str = "auto"  # "auto" (namespaces or SandboxUnavailable) | "namespaces" | "basic" (opt-in, weaker)
  audit_hook: bool = True  # off only to test the namespaces alone

  def __post_init__(self):
    if self.isolation not in ("auto", "namespaces", "basic"):
      raise ValueError(f"isolation must be 'auto', 'namespaces' or 'basic', got {self.isolation!r}")
    if self.isolation == "basic" and not self.audit_hook:
      raise ValueError("isolation='basic' needs the audit hook: without namespaces it alone confines file access")
    numbers = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.type in ("int", "float")}
    bad = {name: value for name, value in numbers.items() if not value > 0}
    if bad:
      raise ValueError(f"sandbox limits must be positive: {bad}")


# --------------------------------------------------------------------------- tests


@dataclasses.dataclass(frozen=True)
class ValueTest:
  """`assert expr == expected` with a literal `expected`, compared in the parent."""

  expr: str
  expected: Any
  source: str


@dataclasses.dataclass(frozen=True)
class CheckTest:
  """Any other assert statement; judged inside the sandbox."""

  source: str


@dataclasses.dataclass(frozen=True)
class StdioTest:
  """Run the whole program with `input` on stdin; stdout must equal `output`
  (trailing whitespace of each line and trailing blank lines ignored)."""

  input: str
  output: str


Test = ValueTest | CheckTest | StdioTest


def compile_test(test: str | dict) -> Test:
  """A test from the JSONL layout: an assert statement, or {"input", "output"}."""
  if isinstance(test, dict):
    if set(test) != {"input", "output"} or not all(isinstance(v, str) for v in test.values()):
      raise ValueError(f"a stdio test is {{'input': str, 'output': str}}, got {test!r}")
    return StdioTest(test["input"], test["output"])
  if not isinstance(test, str):
    raise ValueError(f"a test is an assert statement or an input/output dict, got {test!r}")
  try:
    tree = ast.parse(test)
  except SyntaxError as error:
    raise ValueError(f"test is not valid Python: {test!r}") from error
  if len(tree.body) == 1 and isinstance(stmt := tree.body[0], ast.Assert) and stmt.msg is None:
    compare = stmt.test
    if isinstance(compare, ast.Compare) and len(compare.ops) == 1 and isinstance(compare.ops[0], ast.Eq):
      try:
        expected = ast.literal_eval(compare.comparators[0])
      except ValueError:
        pass
      else:
        return ValueTest(ast.get_source_segment(test, compare.left), expected, test)
  return CheckTest(test)


def normalise_output(text: str) -> str:
  """Stdout as compared: trailing whitespace of each line and trailing blank lines dropped."""
  return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def _judge(test: Test, outcome: dict) -> tuple[bool, str]:
  """(passed, feedback line) for one test from the harness's report."""
  if "error" in outcome:
    return False, f"{_describe(test)} raised {outcome['error']}"
  if isinstance(test, ValueTest):
    got = str(outcome.get("repr", ""))
    try:
      passed = bool(ast.literal_eval(got) == test.expected)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # not a literal
      passed = False
    return passed, "" if passed else f"{test.expr} returned {got[:200]}, expected {test.expected!r}"[:400]
  if isinstance(test, StdioTest):
    got = str(outcome.get("stdout", ""))
    passed = normalise_output(got) == normalise_output(test.output)
    mismatch = f"input {test.input[:100]!r}: printed {got[:200]!r}, expected {test.output[:200]!r}"
    return passed, "" if passed else mismatch
  return bool(outcome.get("ok")), ""


def _describe(test: Test) -> str:
  return test.source if isinstance(test, (ValueTest, CheckTest)) else f"input {test.input[:100]!r}"


def _job_test(test: Test) -> dict:
  if isinstance(test, ValueTest):
    return {"kind": "value", "expr": test.expr}
  if isinstance(test, CheckTest):
    return {"kind": "check", "source": test.source}
  return {"kind": "stdio", "input": test.input}


# --------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """status: "ok" (the harness reported), "timeout", "output_limit" or
  "no_result" (the process died or exited without a report, e.g. killed for
  CPU time or memory, or the candidate exited the interpreter).
  passed: one bool per test (all False unless status is "ok").
  returncode: exit status of the sandbox's first process (-9 when the
  parent killed it, which it also does right after reading a report).
  uid: the uid the candidate ran as (None: the parent's own)."""

  status: str
  passed: tuple[bool, ...]
  feedback: str
  wall_seconds: float
  returncode: int | None
  isolation: str
  uid: int | None

  @property
  def fraction(self) -> float:
    return sum(self.passed) / len(self.passed) if self.passed else 0.0


# --------------------------------------------------------------------------- isolation


def _python() -> str:
  """The base interpreter (not a venv shim): with -I -S it sees only the stdlib."""
  return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


class SandboxUnavailable(RuntimeError, ValueError):
  """The requested isolation cannot work on this machine, so no untrusted code runs. Also a ValueError: as a
  setting (`isolation`) it is a value that cannot work here, and config builders report it as one."""


def _sandbox_uid(isolation: str) -> int | None:
  """A fresh uid for the candidate, or None (basic mode under a non-root parent: the parent's own)."""
  if isolation == "namespaces" or os.geteuid() == 0:
    return _UID_BASE + secrets.randbelow(_UID_SPAN)
  return None


@functools.cache
def _namespace_script() -> str:
  """Shell script run as root inside fresh namespaces: build the chroot, run argv as the uid.

  Arguments: root uid work_mb argv... The root is a tmpfs holding read-only
  binds of the interpreter's prefix and the system library directories (and
  the /lib -> usr/lib style links), /dev/{null,zero,urandom} and a tmpfs
  /work. The shell stays the namespace's first process: PID 1 ignores
  signals it has no handler for, which would make the interpreter immune to
  SIGXCPU.
  """
  wanted = [sys.base_prefix, os.path.dirname(_python()), "/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64"]
  links, binds = {}, set()
  for path in wanted:
    if os.path.islink(path):
      links[path] = os.readlink(path)
      path = os.path.realpath(path)
    if os.path.isdir(path):
      binds.add(os.path.realpath(path))
  binds = sorted(p for p in binds if not any(p.startswith(q + os.sep) for q in binds if q != p))
  q = shlex.quote
  dirs = [*binds, *{os.path.dirname(p) for p in links} - {"/"}, "/work", "/dev"]
  lines = [
    "set -eu",
    "root=$1 uid=$2 work_mb=$3",
    "shift 3",
    "mount --make-rprivate /",
    'mount -t tmpfs -o size=4m,mode=0755 sandbox-root "$root"',
    "mkdir -p " + " ".join(f'"$root"{q(d)}' for d in dirs),
    *(f'ln -s {q(target)} "$root"{q(link)}' for link, target in links.items()),
    *(f'mount -o bind,ro,nosuid,nodev {q(p)} "$root"{q(p)}' for p in binds),
    'mount -t tmpfs -o "size=${work_mb}m,mode=0700,uid=$uid,gid=$uid" sandbox-work "$root/work"',
    'for d in null zero urandom; do : > "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"; done',
    'mount -o remount,ro "$root"',
    'chroot --userspec="$uid:$uid" "$root" "$@"',
  ]
  return "\n".join(lines) + "\n"


@functools.cache
def _namespace_tools() -> tuple[str, str] | None:
  tools = [shutil.which(name) for name in ("unshare", "sh", "mount", "chroot")]
  if os.geteuid() != 0 or not all(tools):
    return None
  return tools[0], tools[1]


@functools.cache
def _startup_failure(isolation: str) -> str | None:
  """Why a probe candidate does not run under `isolation` here (None: it runs). Cached per process."""
  if isolation == "namespaces" and _namespace_tools() is None:
    return "not root, or unshare, mount or chroot not on PATH" if os.geteuid() == 0 else "not root"
  tests = [ValueTest("x", 42, "assert x == 42")]
  probe, output = _run("x = 6 * 7", tests, SandboxLimits(isolation=isolation, wall_seconds=30.0), isolation)
  if probe.status == "ok" and probe.passed == (True,):
    return None
  said = " ".join(output.decode("utf-8", "replace").split())[:300]
  return f"{probe.feedback}{': ' + said if said else ''}"


def available_isolation() -> str:
  """ "namespaces" when a probe candidate runs in namespaces here (probed once), else "basic" (which "auto"
  refuses)."""
  return "basic" if _startup_failure("namespaces") else "namespaces"


def resolve_isolation(limits: SandboxLimits) -> str:
  """The isolation `limits` runs under here ("namespaces" or "basic"); raises SandboxUnavailable (one line)
  when it cannot work, "auto" included when namespaces cannot. Cheap after the first call."""
  if limits.isolation == "basic":
    reason = _startup_failure("basic")
    if reason:
      raise SandboxUnavailable(f"sandbox: isolation='basic' does not start here ({reason})")
    return "basic"
  if available_isolation() == "namespaces":
    return "namespaces"
  raise SandboxUnavailable(
    f"sandbox: namespace isolation is unavailable here ({_startup_failure('namespaces')}), so untrusted code is "
    "not run: it needs root, util-linux unshare and mount, coreutils chroot and permission to create namespaces "
    "(CAP_SYS_ADMIN in a container); or opt in to weaker containment with isolation='basic' (the code env: "
    "env.params.isolation='basic'; see envs/host/sandbox.py for what each mode guarantees)"
  )


# --------------------------------------------------------------------------- running


def _read_capped(proc: subprocess.Popen, deadline: float, cap: int, marker: bytes) -> tuple[bytes, str]:
  """Read stdout until EOF, a complete line starting with `marker` (the
  report: no need to wait for the namespaces to be torn down), the deadline
  or the cap: (data, status)."""
  fd, data = proc.stdout.fileno(), bytearray()
  while True:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      return bytes(data), "timeout"
    ready, _, _ = select.select([fd], [], [], remaining)
    if not ready:
      continue
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      return bytes(data), "ok"
    if len(data) + len(chunk) > cap:
      return b"", "output_limit"
    data += chunk
    at = data.find(marker)
    if at >= 0 and data.find(b"\n", at + len(marker)) >= 0:
      return bytes(data), "ok"


def _kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _survivors(session: int, uid: int | None) -> list[int]:
  """Live (non-zombie) processes in the sandbox's session or owned by its uid."""
  found = []
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
      continue
    state, real_uid = fields.get("State", "").split(), fields.get("Uid", "").split()
    sid = fields.get("NSsid", "").split()
    if state[:1] == ["Z"] or not real_uid or not sid:
      continue
    if int(sid[0]) == session or (uid is not None and int(real_uid[0]) == uid):
      found.append(int(name))
  return found


def _reap(session: int, uid: int | None, timeout: float = 2.0) -> None:
  """SIGKILL whatever the sandbox left until nothing is left (bounded)."""
  deadline = time.monotonic() + timeout
  while (left := _survivors(session, uid)) and time.monotonic() < deadline:
    for pid in left:
      try:
        os.kill(pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    time.sleep(0.002)


def _command(isolation: str, uid: int | None, scratch: str, limits: SandboxLimits) -> tuple[list[str], dict, str]:
  """(argv, environment, candidate's work directory) for one sandbox."""
  python = [_python(), "-I", "-S", "-B", "-c"]
  harness = [*python, _source(SECCOMP_PATH), *python, _source(HARNESS_PATH)]
  if isolation == "basic":
    if uid is not None:
      os.chown(scratch, uid, uid)
    os.chmod(scratch, 0o700)
    return harness, {}, scratch
  unshare, sh = _namespace_tools()
  argv = [
    unshare,
    "--net",
    "--mount",
    "--pid",
    "--ipc",
    "--uts",
    "--fork",
    "--kill-child",
    "--",
    sh,
    "-c",
    _namespace_script(),
    "sandbox-setup",
    scratch,
    str(uid),
    str(limits.work_dir_mb),
    *harness,
  ]
  return argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, NAMESPACE_WORKDIR


def _feed(pipe, payload: bytes) -> None:
  """Write the job and close stdin (in a thread: a large job must not block the deadline)."""
  try:
    pipe.write(payload)
    pipe.close()
  except OSError:  # it died before reading the job
    pass


def run_program(code: str, tests: Sequence[Test], limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
  """Run `code` against `tests` in a fresh sandbox; never raises for anything the code does. Raises
  SandboxUnavailable when `limits.isolation` cannot work here (before running anything)."""
  return _run(code, tests, limits, resolve_isolation(limits))[0]


def _run(code: str, tests: Sequence[Test], limits: SandboxLimits, isolation: str) -> tuple[SandboxResult, bytes]:
  """(result, what the sandbox wrote to stdout and stderr) of one run under `isolation` (not checked)."""
  uid = _sandbox_uid(isolation)
  rlimits = {
    "RLIMIT_CPU": limits.cpu_seconds,
    "RLIMIT_AS": limits.memory_mb << 20,
    "RLIMIT_FSIZE": limits.file_size_mb << 20,
    "RLIMIT_NOFILE": limits.max_open_files,
    "RLIMIT_CORE": 0,
    **({"RLIMIT_NPROC": limits.max_processes} if uid is not None else {}),
  }
  nonce = secrets.token_hex(16).encode()
  scratch = tempfile.mkdtemp(prefix="ragen_sandbox_")
  try:
    argv, env, workdir = _command(isolation, uid, scratch, limits)
    job = {
      "nonce": nonce.decode(),
      "code": code,
      "tests": [_job_test(t) for t in tests],
      "workdir": workdir,
      "uid": uid if isolation == "basic" else None,  # namespaces: chroot --userspec already dropped it
      "limits": rlimits,
      "audit": limits.audit_hook,
      "max_test_output": limits.max_test_output,
    }
    start = time.monotonic()
    proc = subprocess.Popen(
      argv,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      cwd=scratch,
      env=env,
      start_new_session=True,
      close_fds=True,
    )
    try:
      threading.Thread(target=_feed, args=(proc.stdin, json.dumps(job).encode()), daemon=True).start()
      data, status = _read_capped(proc, start + limits.wall_seconds, limits.max_output_bytes, b"\n" + nonce)
    finally:
      _kill_group(proc)
      proc.stdout.close()
      returncode = proc.wait()
      _reap(proc.pid, uid)
    elapsed = time.monotonic() - start
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  outcomes = _parse_report(data, nonce, len(tests)) if status == "ok" else None
  if outcomes is None:
    status = "no_result" if status == "ok" else status
    feedback = {"timeout": "time limit exceeded", "output_limit": "output limit exceeded"}.get(
      status, f"the program did not finish normally (exit status {returncode})"
    )
    return SandboxResult(status, (False,) * len(tests), feedback, elapsed, returncode, isolation, uid), data
  judged = [_judge(t, o) for t, o in zip(tests, outcomes)]
  feedback = next((line for ok, line in judged if not ok and line), "")
  return SandboxResult("ok", tuple(ok for ok, _ in judged), feedback, elapsed, returncode, isolation, uid), data


def _parse_report(data: bytes, nonce: bytes, num_tests: int) -> list[dict] | None:
  """The harness's result line (a Python literal after the nonce), or None."""
  at = data.rfind(b"\n" + nonce)
  if at < 0:
    return None
  line = data[at + 1 + len(nonce) :].split(b"\n", 1)[0]
  try:
    outcomes = ast.literal_eval(line.decode("ascii"))
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError):
    return None
  if not isinstance(outcomes, list) or len(outcomes) != num_tests or not all(isinstance(o, dict) for o in outcomes):
    return None
  return outcomes


@functools.cache
def _source(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


class SandboxPool:
  """At most `max_workers` sandboxes at once (default: twice the CPU count, as
  a sandbox spends part of its life waiting on process start-up), shared by
  every caller (any thread)."""

  def __init__(self, max_workers: int | None = None):
    self.max_workers = max_workers or 2 * (os.cpu_count() or 1)
    self._slots = threading.BoundedSemaphore(self.max_workers)

  def run(self, code: str, tests: Sequence[Test], limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    with self._slots:
      return run_program(code, tests, limits)

  def map(
    self, jobs: Sequence[tuple[str, Sequence[Test]]], limits: SandboxLimits = SandboxLimits()
  ) -> list[SandboxResult]:
    """Run many (code, tests) jobs concurrently; results in job order."""
    with ThreadPoolExecutor(self.max_workers) as executor:
      return list(executor.map(lambda job: self.run(job[0], job[1], limits), jobs))


@functools.cache
def default_pool() -> SandboxPool:
  return SandboxPool()
