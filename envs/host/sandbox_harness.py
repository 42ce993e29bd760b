"""The program that runs inside the sandbox (see `envs.host.sandbox`).

The parent starts `python -I -S -B -c <this file's source>` (exec'd by
`sandbox_seccomp.py` under its seccomp filter) and writes one job (JSON) to its
stdin. Standard library only, and nothing from `envs`: inside the namespace
sandbox only the interpreter and its standard library are visible.

Steps: read the job, lower the resource limits, enter the work directory, drop
to the sandbox uid (basic mode, when started as root: the standard library is
then reached through file descriptors opened before the drop, so a stdlib under
a directory other users cannot enter, such as /root, still imports), install
the audit hook, run the candidate against each test, and write one result line
`<nonce><ascii() of a list of dicts>` to fd 1 (a Python literal; `json` is
not used after the candidate has run because its encoder is Python code that
looks up patchable builtins). Every name the harness needs after the
candidate has run is a local of `main`, so patching builtins or this module
(`sys.modules["__main__"]`) cannot change it.

Test kinds (the expected answers stay in the parent):
  {"kind": "value", "expr": E}   evaluate E in the candidate's namespace; report repr()
  {"kind": "check", "source": S} run statement S (an assert); report whether it raised
  {"kind": "stdio", "input": I}  run the program afresh with I on stdin; report its stdout
"""

import builtins
import io
import json
import os
import resource
import sys

# Events the candidate may never raise (matched as prefixes: "socket." is every socket event).
DENIED_EVENTS = (
  "socket.",
  "ctypes.",
  "subprocess.Popen",
  "os.system",
  "os.exec",
  "os.posix_spawn",
  "os.spawn",
  "os.fork",
  "os.forkpty",
  "os.kill",
  "os.killpg",
  "signal.pthread_kill",
  "sys.settrace",
  "sys.setprofile",
  "sys._current_frames",
  "sys._current_exceptions",
  "sys.addaudithook",
  "gc.get_objects",
  "gc.get_referrers",
  "gc.get_referents",
  "sqlite3.enable_load_extension",
  "sqlite3.load_extension",
  "os.symlink",  # no symlinks: paths inside the work dir stay inside
)
DENIED_IMPORTS = frozenset(
  {
    "ctypes",
    "_ctypes",
    "_posixsubprocess",
    "_testcapi",
    "_testinternalcapi",
    "_testbuffer",
    "_testmultiphase",
    "_xxsubinterpreters",
    "_xxtestfuzz",
    "_socket",
    "socket",
    "multiprocessing",
    "_multiprocessing",
    "__main__",
  }
)
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# Events whose listed argument positions are paths the candidate writes or changes.
WRITE_PATH_EVENTS = {
  "os.mkdir": (0,),
  "os.rmdir": (0,),
  "os.remove": (0,),
  "os.rename": (0, 1),
  "os.link": (0, 1),
  "os.chmod": (0,),
  "os.chown": (0,),
  "os.truncate": (0,),
  "os.utime": (0,),
  "os.setxattr": (0,),
  "os.removexattr": (0,),
  "shutil.rmtree": (0,),
  "shutil.copyfile": (1,),
  "shutil.copymode": (1,),
  "shutil.copystat": (1,),
  "shutil.copytree": (1,),
  "shutil.move": (0, 1),
  "shutil.chown": (0,),
  "shutil.make_archive": (0,),
  "shutil.unpack_archive": (1,),
  "sqlite3.connect": (0,),
  "os.chdir": (0,),
}
READ_PATH_EVENTS = {"os.listdir": (0,), "os.scandir": (0,), "os.getxattr": (0,), "os.listxattr": (0,)}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class CappedBytes(io.BytesIO):
  """A byte buffer that refuses to grow past `cap` bytes."""

  def __init__(self, cap):
    super().__init__()
    self.cap = cap

  def write(self, data):
    if self.tell() + len(data) > self.cap:
      raise OSError("sandbox: output limit exceeded")
    return super().write(data)


def text_stream(raw):
  return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", write_through=True)


def make_audit_hook(workdir, read_roots):
  """An audit hook that confines file access to `workdir` (read-only `read_roots`)
  and refuses processes, signals, sockets, ctypes and frame introspection.

  The hook's decisions use only names bound here, before the candidate runs
  (C functions, constants, builtins), so patching `os`, `os.path`, builtins
  or this module cannot change them. A path must be inside a root both
  lexically (resolved against the cwd by string operations) and after
  `realpath` (which follows symlinks on the host)."""
  getcwd, fspath, realpath, stat = os.getcwd, os.fspath, os.path.realpath, os.stat
  encoding, is_a, kind_of, size = sys.getfilesystemencoding(), isinstance, type, len
  denied_events, denied_imports, frame_attributes = DENIED_EVENTS, DENIED_IMPORTS, FRAME_ATTRIBUTES
  write_events, read_events, write_flags, refuse = WRITE_PATH_EVENTS, READ_PATH_EVENTS, WRITE_FLAGS, PermissionError

  def lexical(path):
    if not path.startswith("/"):
      path = getcwd() + "/" + path
    parts = []
    for part in path.split("/"):
      if part == "..":
        if parts:
          parts.pop()
      elif part not in ("", "."):
        parts.append(part)
    return "/" + "/".join(parts)

  def inside(path, roots):
    for root in roots:
      if path == root or path.startswith(root + "/"):
        return True
    return False

  def under(path, roots):
    try:
      path = fspath(path)
      if kind_of(path) is bytes:
        path = path.decode(encoding, "surrogateescape")
      plain = lexical(path)
      return inside(plain, roots) and inside(realpath(plain), roots)
    except (TypeError, ValueError, OSError):
      return False

  write_roots = (lexical(realpath(workdir)),)
  # A root as given and as resolved: /proc/self/fd/N (a path is checked both ways) and what it points to.
  read_only = tuple({lexical(r) for r in read_roots} | {lexical(realpath(r)) for r in read_roots})

  def is_directory(path):
    try:
      return stat(path).st_mode & 0o170000 == 0o040000
    except (TypeError, ValueError, OSError):
      return False

  def readable(path):
    if under(path, write_roots):
      return True
    return under(path, read_only) and not is_directory(path)  # no directory fds outside (dir_fd tricks)

  def hook(event, args):
    if event == "open":
      path, mode, flags = args
      if path is None or is_a(path, int):
        return
      if is_a(mode, str):
        writing = "w" in mode or "a" in mode or "x" in mode or "+" in mode
      else:
        writing = (flags or 0) & write_flags
      if under(path, write_roots) or (not writing and readable(path)):
        return
    elif event in write_events:
      if event == "sqlite3.connect" and args[0] in (":memory:", b":memory:", ""):
        return
      if all_inside_work(args, write_events[event]):
        return
    elif event in read_events:
      path = args[0]
      if path is None or is_a(path, int) or under(path, write_roots + read_only):
        return
    elif event == "import":
      if args[0].partition(".")[0] not in denied_imports:
        return
    elif event == "object.__getattr__":
      if args[1] not in frame_attributes:
        return
    elif not event.startswith(denied_events):
      return
    raise refuse(f"sandbox: {event} is not allowed")

  def all_inside_work(args, positions):
    for i in positions:
      if i < size(args) and not is_a(args[i], int) and not under(args[i], write_roots):
        return False
    return True

  return hook


def reach_stdlib_through_fds():
  """Point sys.path (and the packages already imported) at /proc/self/fd/N for directories opened now,
  so that the stdlib still imports after the uid drop however its parent directories are protected."""
  moved = {}
  for path in sys.path:
    if path and os.path.exists(path):
      moved[path] = f"/proc/self/fd/{os.open(path, os.O_PATH)}"

  def move(path):
    for old, new in moved.items():
      if path == old or path.startswith(old + "/"):
        return new + path[len(old) :]
    return path

  sys.path[:] = [move(p) for p in sys.path]
  for module in list(sys.modules.values()):
    paths = getattr(module, "__path__", None)
    if isinstance(paths, list):
      paths[:] = [move(p) for p in paths]
  sys.path_importer_cache.clear()


def confine(job):
  """Limits, work directory, uid, environment, streams and audit hook (before the candidate runs)."""
  for name, value in job["limits"].items():  # soft == hard: the candidate cannot raise them again
    resource.setrlimit(getattr(resource, name), (value, value + (1 if name == "RLIMIT_CPU" else 0)))
  os.chdir(job["workdir"])
  if job["uid"] is not None:
    reach_stdlib_through_fds()
    os.setgroups([])
    os.setgid(job["uid"])
    os.setuid(job["uid"])
    if os.getuid() != job["uid"] or os.geteuid() != job["uid"] or os.getgid() != job["uid"]:
      raise OSError("the uid drop did not take")
  os.environ.clear()
  os.environ.update({"TMPDIR": job["workdir"], "HOME": job["workdir"]})
  builtins.exit = builtins.quit = sys.exit  # `site` (skipped by -S) normally adds these
  sink = text_stream(CappedBytes(job["max_test_output"]))  # the candidate's own prints, discarded
  sys.stdin, sys.stdout, sys.stderr = text_stream(io.BytesIO()), sink, sink
  if job["audit"]:
    read_roots = [p for p in sys.path if p] + ["/dev/null", "/dev/zero", "/dev/urandom"]
    sys.addaudithook(make_audit_hook(job["workdir"], read_roots))
  return sink


def main():
  job = json.loads(sys.stdin.buffer.read())
  try:
    sink = confine(job)
  except OSError as error:  # fail closed: no candidate runs half-confined
    os.write(1, f"sandbox setup failed: {error}\n".encode())
    os._exit(2)
  # Everything used after the candidate has run is bound here, so patching
  # builtins or this module's globals cannot change how results are made.
  run, evaluate, as_text, as_ascii, length, kind_of = exec, eval, repr, ascii, len, type
  new_stream, new_bytes, capped = text_stream, io.BytesIO, CappedBytes
  write, exit_now, getpid = os.write, os._exit, os.getpid
  system_exit, base_exception = SystemExit, BaseException
  harness_pid, nonce, cap = getpid(), job["nonce"].encode(), job["max_test_output"]

  def describe(error):
    return f"{kind_of(error).__name__}: {error}"[:500]

  try:
    code = compile(job["code"], "<candidate>", "exec")
    load_error = None
  except base_exception as error:  # SyntaxError, MemoryError, RecursionError, ...
    code, load_error = None, describe(error)
  module = {"__name__": "solution", "__builtins__": builtins}
  if code is not None and any(t["kind"] != "stdio" for t in job["tests"]):
    try:
      run(code, module)
    except base_exception as error:
      load_error = describe(error)

  def run_program(stdin_text):
    out = capped(cap)
    stream = new_stream(out)  # keep a reference: a collected wrapper closes `out`
    sys.stdin = new_stream(new_bytes(stdin_text.encode()))
    sys.stdout = sys.stderr = stream
    try:
      run(code, {"__name__": "__main__", "__builtins__": builtins})
    except system_exit:
      pass
    finally:
      sys.stdin, sys.stdout, sys.stderr = new_stream(new_bytes()), sink, sink
    return out.getvalue().decode("utf-8", "replace")

  results = []
  for test in job["tests"]:
    kind = test["kind"]
    try:
      if code is None or (load_error and kind != "stdio"):
        results.append({"error": load_error})
      elif kind == "value":
        text = as_text(evaluate(test["expr"], module))
        results.append({"repr": text} if length(text) <= cap else {"error": "value too large"})
      elif kind == "check":
        run(test["source"], module)
        results.append({"ok": True})
      else:
        results.append({"stdout": run_program(test["input"])})
    except base_exception as error:
      results.append({"error": describe(error)})
  if getpid() != harness_pid:  # a forked copy of the candidate does not report
    exit_now(1)
  report = b"\n" + nonce + as_ascii(results).encode() + b"\n"
  while report:
    report = report[write(1, report) :]
  exit_now(0)  # skip interpreter teardown: no candidate atexit handlers or thread joins


if __name__ == "__main__":
  main()
