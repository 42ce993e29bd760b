"""Where a jitted program's time goes, op by op: a `jax.profiler` trace of a few calls (its Perfetto JSON), the
XLA op events summed by instruction and labelled from the compiled HLO with what each one computes.

Instruction names in the trace are the compiled module's (`fusion.12`, `ynn_fusion.3`); the label is the
instruction's own kind, the operations fused into it and the JAX op that made it (the HLO's `op_name`).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile

import jax

# An HLO instruction: `%name = type opcode(operands), ...metadata={op_name="..."}`.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+(?: \S+)*?) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^%?([\w.\-]+) \(.*\{$")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]+)"')
_DATA_MOVES = {"dynamic-slice", "dynamic-update-slice", "copy", "slice", "transpose", "concatenate", "pad", "gather",
               "scatter", "broadcast"}
_NOT_WORK = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "reshape"}


@dataclasses.dataclass(frozen=True)
class OpTime:
  """One instruction's share of the traced time: `seconds` per call, `kind` (dot / data movement / elementwise
  and reductions / other), `what` (its shape, its fused operations and the JAX op it comes from)."""

  name: str
  seconds: float
  share: float
  kind: str
  what: str


def _instructions(hlo_text: str) -> dict[str, tuple[str, str]]:
  """instruction name -> (kind, what) over every computation of a compiled module's text."""
  computations: dict[str, list[tuple[str, str, str, str]]] = collections.defaultdict(list)  # name, opcode, rest, type
  current = ""
  for line in hlo_text.splitlines():
    if (head := _COMPUTATION.match(line.replace("ENTRY ", ""))):
      current = head.group(1)
    elif (inst := _INSTRUCTION.match(line)):
      shape = re.sub(r"\{[^}]*\}", "", inst.group(2))  # without its layout
      computations[current].append((inst.group(1), inst.group(3), inst.group(4), shape))
  labels = {}
  for body in computations.values():
    for name, opcode, rest, shape in body:
      called = _CALLS.search(rest)
      fused = ([op for _, op, _, _ in computations.get(called.group(1), ()) if op not in _NOT_WORK]
               if opcode == "fusion" and called else [opcode])
      op_name = _OP_NAME.search(rest)
      source = "/".join(op_name.group(1).split("/")[-2:]) if op_name else ""
      if any(op in ("dot", "convolution") for op in fused):
        kind = "dot"
      elif fused and set(fused) <= _DATA_MOVES:
        kind = "data movement"
      elif opcode in ("while", "conditional", "call"):
        kind = "loop"
      elif opcode == "custom-call":
        kind = "other"
      else:
        kind = "elementwise and reductions"
      ops = ",".join(dict.fromkeys(fused))
      labels[name] = (kind, f"{shape} {ops[:60]}" + (f" <- {source}" if source else ""))
  return labels


def op_profile(compiled, calls: list[tuple]) -> list[OpTime]:
  """Per-instruction seconds per call of `compiled` (a `jax.stages.Compiled`) run once on each argument tuple of
  `calls` under the profiler (one tuple a call, so that donated arguments are made beforehand), longest first.
  Loops (`while`) are left out: their bodies' instructions are counted instead."""
  labels = _instructions(compiled.as_text())
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      for args in calls:
        jax.block_until_ready(compiled(*args))
    (trace_file,) = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    with gzip.open(trace_file) as f:
      trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  micros = collections.Counter()
  for event in events:
    name = event.get("name", "")
    if event.get("ph") == "X" and name in labels and labels[name][0] != "loop":
      micros[name] += event.get("dur", 0.0)
  total = sum(micros.values()) or 1.0
  return [OpTime(name, us / len(calls) / 1e6, us / total, *labels[name]) for name, us in micros.most_common()]


def print_profile(title: str, ops: list[OpTime], top: int = 8) -> None:
  """The shares of each kind of op, then the `top` instructions."""
  if not ops:  # e.g. a GPU's trace names its kernels, not the module's instructions
    print(f"  profile of {title}: no op event of the trace names an instruction of the program", flush=True)
    return
  kinds = collections.Counter()
  for op in ops:
    kinds[op.kind] += op.share
  print(f"  profile of {title}: " + ", ".join(f"{kind} {share:.0%}" for kind, share in kinds.most_common()),
        flush=True)
  for op in ops[:top]:
    print(f"    {op.share:5.1%} {1e3 * op.seconds:8.2f} ms  {op.kind:<26s} {op.name}: {op.what}", flush=True)
