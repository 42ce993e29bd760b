"""First stage of every sandbox (see `envs.host.sandbox`): install a seccomp filter, then exec argv under it.

The parent runs `python -I -S -B -c <this file's source> <harness argv...>`. Standard library only. The
filter is the kernel's: nothing the candidate does, in Python or in C, lifts it, and it survives the exec
into the harness, which therefore never loads ctypes (a loaded ctypes would let candidate code write memory
behind the audit hook's back). `PR_SET_NO_NEW_PRIVS` comes with it (required for an unprivileged filter;
set-uid programs then gain nothing on exec).

Refused with EPERM whatever the audit hook says, for system calls that name another process (the process's
own pid, and 0 where it means "this process", stay allowed):
  signals: kill (also to process groups and -1), tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, tkill;
  pidfds: pidfd_open, pidfd_getfd, pidfd_send_signal (no audit events exist for these);
  ptrace, process_vm_readv/writev, process_madvise, kcmp, migrate_pages, move_pages, perf_event_open;
  another process's limits, priority or scheduling: prlimit64, setpriority, ioprio_set, sched_set*;
and for everyone: mknod and mknodat (device nodes, FIFOs: no audit events), new processes (fork, vfork,
clone without CLONE_THREAD; clone3 answers ENOSYS so that thread creation falls back to clone), socket, and
io_uring_setup (whose requests would not pass through this filter). System calls of another ABI (i386 or x32
on x86_64) kill the process. Tables exist for x86_64 and aarch64; elsewhere the sandbox does not start.
"""

import ctypes
import os
import sys

ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # machine: (AUDIT_ARCH_*, column below)
# System call numbers (the kernel's asm/unistd*.h): (x86_64, aarch64); None where the architecture lacks it.
SYSCALLS = {
  "kill": (62, 129),
  "tkill": (200, 130),
  "tgkill": (234, 131),
  "rt_sigqueueinfo": (129, 138),
  "rt_tgsigqueueinfo": (297, 240),
  "pidfd_open": (434, 434),
  "pidfd_send_signal": (424, 424),
  "pidfd_getfd": (438, 438),
  "ptrace": (101, 117),
  "process_vm_readv": (310, 270),
  "process_vm_writev": (311, 271),
  "process_madvise": (440, 440),
  "kcmp": (312, 272),
  "migrate_pages": (256, 238),
  "move_pages": (279, 239),
  "perf_event_open": (298, 241),
  "prlimit64": (302, 261),
  "setpriority": (141, 140),
  "ioprio_set": (251, 30),
  "sched_setparam": (142, 118),
  "sched_setscheduler": (144, 119),
  "sched_setaffinity": (203, 122),
  "sched_setattr": (314, 274),
  "mknod": (133, None),
  "mknodat": (259, 33),
  "fork": (57, None),
  "vfork": (58, None),
  "clone": (56, 220),
  "clone3": (435, 435),
  "socket": (41, 198),
  "io_uring_setup": (425, 425),
}
SELF = "self"  # stands for the caller's pid
OWN_PID = (0, SELF)
# How each call is judged: "deny" (EPERM), "enosys", "thread" (clone: only with CLONE_THREAD), or the checks
# that must all hold to allow it: (argument index, allowed values of its low 32 bits).
POLICY = {
  "kill": [(0, OWN_PID)],
  "tgkill": [(0, (SELF,))],
  "rt_sigqueueinfo": [(0, (SELF,))],
  "rt_tgsigqueueinfo": [(0, (SELF,))],
  "prlimit64": [(0, OWN_PID)],
  "sched_setparam": [(0, OWN_PID)],
  "sched_setscheduler": [(0, OWN_PID)],
  "sched_setaffinity": [(0, OWN_PID)],
  "sched_setattr": [(0, OWN_PID)],
  "setpriority": [(0, (0,)), (1, OWN_PID)],  # PRIO_PROCESS only (PRIO_USER 0 would reach the whole uid)
  "ioprio_set": [(0, (1,)), (1, OWN_PID)],  # IOPRIO_WHO_PROCESS only
  "clone": "thread",
  "clone3": "enosys",
  **dict.fromkeys(
    "tkill pidfd_open pidfd_send_signal pidfd_getfd ptrace process_vm_readv process_vm_writev process_madvise "
    "kcmp migrate_pages move_pages perf_event_open mknod mknodat fork vfork socket io_uring_setup".split(),
    "deny",
  ),
}
LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|{JEQ,JGE,JSET}|K, BPF_RET|K
ALLOW, KILL_PROCESS, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, ENOSYS, CLONE_THREAD, X32_BIT = 1, 38, 0x10000, 0x40000000
NR_OFFSET, ARCH_OFFSET = 0, 4  # struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38


def arg_offset(index):
  return 16 + 8 * index  # the low 32 bits (little-endian)


def rule_code(rule, pid):
  """The instructions run once the call number matched: they end in a return."""
  if rule in ("deny", "enosys"):
    return [(RET, 0, 0, ERRNO | (EPERM if rule == "deny" else ENOSYS))]
  if rule == "thread":
    return [(LD, 0, 0, arg_offset(0)), (JSET, 0, 1, CLONE_THREAD), (RET, 0, 0, ALLOW), (RET, 0, 0, ERRNO | EPERM)]
  code = [(RET, 0, 0, ALLOW), (RET, 0, 0, ERRNO | EPERM)]
  for index, allowed in reversed(rule):  # built backwards: each check jumps to the next one or to EPERM
    values = [pid if v == SELF else v for v in allowed]
    jumps = [(JEQ, len(values) - 1 - i, 0 if i < len(values) - 1 else len(code) - 1, v) for i, v in enumerate(values)]
    code = [(LD, 0, 0, arg_offset(index)), *jumps, *code]
  return code


def program(machine, pid):
  """The classic BPF filter for `machine` and the process `pid`: (code, jt, jf, k) tuples."""
  if machine not in ARCHES or sys.byteorder != "little":
    raise OSError(f"no system call table for {machine} ({sys.byteorder}-endian); known: {sorted(ARCHES)}")
  arch, column = ARCHES[machine]
  code = [(LD, 0, 0, ARCH_OFFSET), (JEQ, 1, 0, arch), (RET, 0, 0, KILL_PROCESS), (LD, 0, 0, NR_OFFSET)]
  if machine == "x86_64":
    code += [(JGE, 0, 1, X32_BIT), (RET, 0, 0, KILL_PROCESS)]
  for name, rule in POLICY.items():
    number = SYSCALLS[name][column]
    if number is not None:
      block = rule_code(rule, pid)
      code += [(JEQ, 0, len(block), number), *block]
  return code + [(RET, 0, 0, ALLOW)]


def install(instructions):
  """no_new_privs, then the filter, on the calling thread (the interpreter has no other thread here)."""

  class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

  class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

  filters = (SockFilter * len(instructions))(*(SockFilter(*i) for i in instructions))
  fprog = SockFprog(len(instructions), filters)
  prctl = ctypes.CDLL(None, use_errno=True).prctl
  prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
  for option, value in ((PR_SET_NO_NEW_PRIVS, 1), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER)):
    argument = ctypes.addressof(fprog) if option == PR_SET_SECCOMP else 0
    if prctl(option, value, argument, 0, 0) != 0:
      error = ctypes.get_errno()
      raise OSError(error, f"prctl({option}): {os.strerror(error)}")


def main():
  try:
    install(program(os.uname().machine, os.getpid()))
  except OSError as error:
    os.write(2, f"sandbox setup failed: seccomp: {error}\n".encode())
    os._exit(2)
  os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
  main()
