"""A diagnosis of an incumbent on its bucket: where it stands against its roofline and what bounds it.

Two sources, neither needing a GPU at the time of the diagnosis:
- the compiled kernel (harness/bench/compile_probe.py, sm_90 compiled on the CPU): programs of the grid against
  the H200's SMs, registers and spills, shared memory, and the instruction mix of the inner loop;
- the ledger's measurements: the incumbent's fraction of the copy or compute ceiling, from the bucket's
  latest benchmark rows under its label (none before the first GPU run: said so).

What bounds it, first rule that holds (each rule's words go into `reasons`, all rules that hold do):
1. registers spill to local memory -> latency (every spilled value is a memory round trip);
2. fewer programs than SMs -> latency (part of the GPU idles however fast each program is);
3. measured at 70% or more of the op's ceiling -> that ceiling's kind (memory or compute): near its roofline;
4. the inner loop spends more than three instructions on integer arithmetic and conversions for each
   memory, tensor-core or floating-point one, and issues no warpgroup MMA (wgmma runs asynchronously, each
   one a whole tile's work, so counting instructions says nothing there) -> latency (issue-bound: address
   math and conversions, not data movement);
5. otherwise the op's own roofline side (Op.bound: arithmetic intensity against the machine's balance).
The proposers read `bound` to order what they try (agent/search.py) and print `lines()` in prompts.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from ...ops import get_op
from ...sanitizer.canonical import as_written
from .compile_probe import INCUMBENT_TIMEOUT_S, CompileProfile, LaunchProfile, profile_source

SM_COUNT = 132  # the H200
SHARED_PER_SM = 233472  # 228 KB of shared memory an H200 SM holds
SHARED_PER_PROGRAM = 232448  # 227 KB of it one program may use
NEAR_ROOFLINE = 0.7
ISSUE_RATIO = 3.0
REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64


@dataclass
class Diagnosis:
    op: str
    bucket: str
    dtype: str
    incumbent: str
    source_hash: str
    bound: str  # "memory" | "compute" | "latency"
    reasons: List[str] = field(default_factory=list)
    roofline: Optional[float] = None  # measured fraction of the ceiling (median over the bucket's shapes)
    ceiling_kind: Optional[str] = None
    measured_on: Optional[str] = None
    programs: Optional[int] = None  # of the main kernel, fewest over the bucket's shapes
    registers: Optional[int] = None
    spill_bytes: Optional[int] = None
    shared_bytes: Optional[int] = None
    programs_per_sm: Optional[int] = None  # resident at once, from registers, shared memory and warps
    loop_mix: Dict[str, int] = field(default_factory=dict)
    compile_error: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Diagnosis":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def lines(self) -> List[str]:
        """What people and prompts read: the bound, the roofline, the compiled kernel, the reasons."""
        roof = (
            f"{self.roofline:.0%} of the {self.ceiling_kind} ceiling (measured on {self.measured_on})"
            if self.roofline is not None
            else "no measurement on a GPU yet"
        )
        out = [f"bound: {self.bound}; roofline: {roof}"]
        if self.compile_error:
            out.append(f"compiled kernel: not read ({self.compile_error})")
        elif self.programs is not None:
            mix = ", ".join(f"{k} {v}" for k, v in sorted(self.loop_mix.items(), key=lambda kv: -kv[1]))
            out.append(
                f"compiled for sm_90: {self.programs} programs for {SM_COUNT} SMs "
                f"({self.programs_per_sm} resident per SM), {self.registers} registers, "
                f"{self.spill_bytes} bytes spilled, {self.shared_bytes} bytes shared memory"
                + (f"; inner loop: {mix}" if mix else "; no loop")
            )
        out += [f"- {r}" for r in self.reasons]
        return out


def programs_per_sm(launch: LaunchProfile) -> int:
    """Programs of this kernel an SM holds at once: the tightest of registers, shared memory and warps."""
    limits = [MAX_WARPS_PER_SM // max(1, launch.num_warps), 32]
    if launch.registers:
        per_program = ((launch.registers + 7) // 8 * 8) * 32 * launch.num_warps
        limits.append(REGISTERS_PER_SM // per_program)
    if launch.shared_bytes:
        limits.append(SHARED_PER_SM // (launch.shared_bytes + 1024))  # the driver reserves 1 KB a program
    return max(0, min(limits))


def _main_launches(profile: CompileProfile) -> List[LaunchProfile]:
    """The first launch of each shape: the op's main kernel (reductions and combines come after it)."""
    seen, out = set(), []
    for x in profile.launches:
        if x.shape not in seen:
            seen.add(x.shape)
            out.append(x)
    return out


def measured_roofline(rows: Sequence) -> tuple:
    """(median fraction of the ceiling, its kind, the GPU) over the latest benchmark row of each shape."""
    latest: Dict[str, Any] = {}
    for r in rows:
        if r.fraction_of_ceiling is not None and not r.implausible:
            latest[r.shape_key] = r  # rows come oldest first
    if not latest:
        return None, None, None
    last = list(latest.values())
    return (statistics.median(r.fraction_of_ceiling for r in last), last[-1].ceiling_kind, last[-1].gpu_name)


def _compiled_facts(d: Diagnosis, profile: CompileProfile) -> None:
    if profile.error:
        d.compile_error = profile.error
        return
    mains = _main_launches(profile)
    if not mains:
        d.compile_error = "the wrapper launched no kernel at these shapes"
        return
    fewest = min(mains, key=lambda x: x.programs)
    worst = max(mains, key=lambda x: (x.spill_bytes or 0, x.registers or 0))
    d.programs, d.registers, d.spill_bytes = fewest.programs, worst.registers, worst.spill_bytes
    d.shared_bytes = max(x.shared_bytes for x in mains)
    d.programs_per_sm = min(programs_per_sm(x) for x in mains)
    d.loop_mix = dict(mains[0].loop_mix)


def _classify(d: Diagnosis, op_bound: str) -> None:
    """`bound` and `reasons` by the rules of the module's docstring."""
    bounds = []
    if d.spill_bytes:
        bounds.append("latency")
        d.reasons.append(f"registers spill: {d.spill_bytes} bytes per thread go to local memory")
    if d.programs is not None and d.programs < SM_COUNT:
        bounds.append("latency")
        d.reasons.append(f"{d.programs} programs for {SM_COUNT} SMs: part of the GPU idles")
    if d.roofline is not None and d.roofline >= NEAR_ROOFLINE:
        bounds.append(d.ceiling_kind or op_bound)
        d.reasons.append(f"at {d.roofline:.0%} of its ceiling: near its roofline")
    mix = d.loop_mix
    busy = mix.get("global", 0) + mix.get("tensor", 0) + mix.get("float", 0)
    issue = mix.get("integer", 0) + mix.get("convert", 0)
    if busy and issue > ISSUE_RATIO * busy and not mix.get("wgmma"):
        bounds.append("latency")
        d.reasons.append(
            f"issue-bound: the inner loop spends {issue} instructions on integer arithmetic and "
            f"conversions against {busy} that move or compute data"
        )
    d.bound = bounds[0] if bounds else op_bound
    if not bounds:
        d.reasons.append(f"by its arithmetic intensity the op is {op_bound}-bound on the H200")


def diagnose(
    op: str,
    bucket: str,
    dtype: str,
    shapes: Sequence,
    source: str,
    incumbent: str,
    profile: CompileProfile,
    bench_rows: Sequence = (),
) -> Diagnosis:
    """The diagnosis from a compiled profile and the incumbent's benchmark rows on the bucket."""
    d = Diagnosis(op, bucket, dtype, incumbent, as_written(source).hash, bound="")
    d.roofline, d.ceiling_kind, d.measured_on = measured_roofline(bench_rows)
    _compiled_facts(d, profile)
    _classify(d, get_op(op).bound(shapes[0]) if shapes else "memory")
    return d


def diagnose_incumbent(
    ledger,
    run_id: Optional[str],
    op: str,
    bucket: str,
    dtype: str,
    shapes: Sequence,
    source: str,
    incumbent: str,
    profile: Callable[..., CompileProfile] = profile_source,
) -> Diagnosis:
    """Diagnose the bucket's incumbent and record it in the ledger. The compiled facts of a source are
    read from an earlier diagnosis of the same source and bucket when there is one (the compile is the
    slow part); the measurements are read afresh."""
    h = as_written(source).hash
    earlier = ledger.diagnoses(op=op, bucket=bucket, dtype=dtype, source_hash=h)
    rows = ledger.bench_results(op=op, bucket=bucket, dtype=dtype, label=incumbent)
    if earlier and not earlier[-1].document.get("compile_error"):
        d = Diagnosis.from_json(earlier[-1].document)
        d.incumbent, d.reasons = incumbent, []
        d.roofline, d.ceiling_kind, d.measured_on = measured_roofline(rows)
        _classify(d, get_op(op).bound(shapes[0]) if shapes else "memory")
    else:
        compiled = profile(source, op, [s.key() for s in shapes], dtype, INCUMBENT_TIMEOUT_S)
        d = diagnose(op, bucket, dtype, shapes, source, incumbent, compiled, rows)
    ledger.record_diagnosis(run_id, op, bucket, dtype, h, incumbent, d.bound, d.to_json())
    return d
