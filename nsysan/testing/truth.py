"""`PlantedTruth`: the exact numbers a correct analysis must recover from a synthetic trace.

Scenario-specific numbers (planted gaps, exposed communication per step, per-range GPU time)
come from how each scenario placed its events. The generic per-device numbers are computed
here from the builder's planted records with deliberately naive sort-and-sweep code that
shares nothing with ``nsysan.frames.intervals``: it is an independent oracle, not a second
copy of the code under test.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsysan.testing._model import GpuOp

Interval = tuple[int, int]

#: overlap-state class of each op class (the short names nsysan's overlap pass uses)
STATE_CLASS = {
    "compute": "compute",
    "nccl": "nccl",
    "memcpy_h2d": "h2d",
    "memcpy_d2h": "d2h",
    "memcpy_d2d": "d2d",
    "memcpy_p2p": "p2p",
    "memset": "memset",
}


# -- naive interval arithmetic (the oracle) ---------------------------------------------------
def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged (touching intervals merge), zero-length intervals dropped."""
    out: list[list[int]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(intervals: Iterable[Interval]) -> int:
    return sum(e - s for s, e in union(intervals))


def complement(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    """The parts of ``[lo, hi)`` that no interval covers."""
    out, cur = [], lo
    for s, e in union(intervals):
        if s > cur:
            out.append((cur, min(s, hi)))
        cur = max(cur, e)
        if cur >= hi:
            break
    if cur < hi:
        out.append((cur, hi))
    return [(s, e) for s, e in out if e > s]


def overlap(a: Iterable[Interval], b: Iterable[Interval]) -> int:
    """Length of ``union(a) ∩ union(b)``."""
    ua, ub = union(a), union(b)
    i = j = n = 0
    while i < len(ua) and j < len(ub):
        s, e = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        n += max(0, e - s)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return n


def states(ops: Iterable[GpuOp], lo: int, hi: int) -> dict[str, int]:
    """Time in each overlap state over ``[lo, hi)``: ``+``-joined sorted class names active at
    once, or ``idle``. A plain boundary sweep with a counter per class."""
    events = sorted(
        (t, delta, STATE_CLASS[o.op_class])
        for o in ops
        if o.end_ns > o.start_ns
        for t, delta in ((max(o.start_ns, lo), 1), (min(o.end_ns, hi), -1))
    )
    active: dict[str, int] = {}
    out: dict[str, int] = {}
    t_prev = lo
    for t, delta, cls in events:
        if t > t_prev:
            key = "+".join(sorted(c for c, n in active.items() if n > 0)) or "idle"
            out[key] = out.get(key, 0) + (t - t_prev)
            t_prev = t
        active[cls] = active.get(cls, 0) + delta
    if hi > t_prev:
        out["idle"] = out.get("idle", 0) + (hi - t_prev)
    return out


# -- truth records ---------------------------------------------------------------------------
@dataclass
class DeviceTruth:
    """What the GPU did, for one device (``pid`` None: all processes) or one (pid, device)."""

    device_id: int
    pid: int | None
    span: Interval  # [first op start, last op end)
    busy_ns: int  # union of kernels, copies and memsets
    gaps: list[Interval]  # every idle interval inside the span, in time order
    compute_ns: int  # union of compute kernels
    nccl_ns: int  # union of NCCL kernels
    exposed_nccl_ns: int  # NCCL active and compute not
    h2d_ns: int
    h2d_unoverlapped_ns: int  # H2D active and compute not
    states: dict[str, int]  # overlap state -> ns; sums to the span

    @property
    def span_ns(self) -> int:
        return self.span[1] - self.span[0]

    @property
    def idle_ns(self) -> int:
        return self.span_ns - self.busy_ns

    def gaps_at_least(self, threshold_ns: int) -> list[Interval]:
        return [g for g in self.gaps if g[1] - g[0] >= threshold_ns]


@dataclass
class GapTruth:
    """A gap the scenario planted on purpose, with what the host did during it."""

    device_id: int
    pid: int
    start_ns: int
    end_ns: int
    cause: str  # one of nsysan.frames.schemas.GAP_CAUSES
    step: int | None = None
    # ns of the gap covered by each kind of host activity on the launching thread(s)
    sync_api_ns: int = 0
    sync_copy_ns: int = 0
    launch_ns: int = 0
    osrt_ns: int = 0
    nvtx_ns: int = 0  # NVTX ranges other than the "step N" ranges (which enclose everything)
    detail: str = ""  # the API / range / call names that explain it
    ranges: dict[str, int] = field(default_factory=dict)  # every covering range name -> ns

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class KernelTruth:
    demangled_name: str
    short_name: str
    op_class: str
    count: int
    total_ns: int
    min_ns: int
    max_ns: int


@dataclass
class RangeTruth:
    """One NVTX range and the GPU work its launch calls enqueued (the nvtxgpuproj rule)."""

    name: str
    domain: str  # "" for the default domain
    style: str  # push_pop | start_end
    pid: int
    tid: int
    start_ns: int
    end_ns: int
    depth: int  # same-thread containment depth (nvtxgpuproj's Lvl); -1: not same-thread
    parent: str | None  # name of the tightest enclosing same-thread range
    n_gpu_ops: int  # distinct launch calls (correlation ids), as nvtxgpuproj counts
    n_gpu_records: int  # GPU rows (a graph launch counts once above, once per kernel here)
    proj_start_ns: int | None
    proj_end_ns: int | None
    gpu_busy_ns: int  # union of the ops' intervals
    exclusive_gpu_ns: int  # ops whose innermost enclosing range is this one

    @property
    def qualified_name(self) -> str:
        """How nsys's reports name it: ``domain:name`` outside the default domain."""
        return f"{self.domain}:{self.name}" if self.domain else self.name


@dataclass
class LayerTruth:
    """Ranges aggregated by (domain, name)."""

    domain: str
    name: str
    instances: int
    n_gpu_ops: int
    n_gpu_records: int
    gpu_busy_ns: int
    exclusive_gpu_ns: int


@dataclass
class PlantedTruth:
    scenario: str
    path: Path
    layout: str
    seed: int
    duration_ns: int
    session_start_utc_ns: int
    devices: dict[int, DeviceTruth]  # scope=device
    process_devices: dict[tuple[int, int], DeviceTruth]  # scope=process_device (pid, device)
    kernels: dict[str, KernelTruth]  # by demangled name (what `nsys stats -r gpukernsum` groups)
    steps: list[Interval] = field(default_factory=list)  # NVTX "step N" ranges, CPU time
    planted_gaps: list[GapTruth] = field(default_factory=list)
    gap_threshold_ns: int = 1_000_000  # planted_gaps lists every gap at least this long
    # device -> NCCL time with no compute, per step (each step's exposed intervals lie well
    # inside both its CPU "step N" range and the GPU work that range launched)
    exposed_nccl_per_step_ns: dict[int, list[int]] = field(default_factory=dict)
    ranges: list[RangeTruth] = field(default_factory=list)
    layers: dict[tuple[str, str], LayerTruth] = field(default_factory=dict)
    attribution_coverage_frac: float | None = None  # GPU busy inside any range / all busy
    counts: dict[str, int] = field(default_factory=dict)  # rows per raw table
    extra: dict[str, Any] = field(default_factory=dict)  # scenario-specific numbers

    def device(self, device_id: int = 0) -> DeviceTruth:
        return self.devices[device_id]

    def gaps_at_least(self, threshold_ns: int, device_id: int = 0) -> list[Interval]:
        return self.devices[device_id].gaps_at_least(threshold_ns)

    def summary(self) -> dict[str, Any]:
        """The headline numbers as plain JSON-able values (for READMEs and fixtures)."""
        return {
            "scenario": self.scenario,
            "file": self.path.name,
            "layout": self.layout,
            "seed": self.seed,
            "duration_ns": self.duration_ns,
            "devices": {
                str(d): {
                    "span_ns": t.span_ns,
                    "busy_ns": t.busy_ns,
                    "idle_ns": t.idle_ns,
                    "gaps_ge_1ms": [list(g) for g in t.gaps_at_least(1_000_000)],
                    "compute_ns": t.compute_ns,
                    "nccl_ns": t.nccl_ns,
                    "exposed_nccl_ns": t.exposed_nccl_ns,
                    "h2d_ns": t.h2d_ns,
                    "h2d_unoverlapped_ns": t.h2d_unoverlapped_ns,
                    "states": dict(sorted(t.states.items())),
                }
                for d, t in self.devices.items()
            },
            "steps": [list(s) for s in self.steps],
            "planted_gaps": [
                {
                    "device_id": g.device_id,
                    "pid": g.pid,
                    "start_ns": g.start_ns,
                    "end_ns": g.end_ns,
                    "cause": g.cause,
                    "step": g.step,
                    "detail": g.detail,
                }
                for g in self.planted_gaps
            ],
            "exposed_nccl_per_step_ns": {
                str(d): v for d, v in self.exposed_nccl_per_step_ns.items()
            },
            "kernels": {
                k.demangled_name: {"count": k.count, "total_ns": k.total_ns}
                for k in sorted(self.kernels.values(), key=lambda k: -k.total_ns)
            },
            "layers": [
                {
                    "domain": lt.domain,
                    "name": lt.name,
                    "instances": lt.instances,
                    "n_gpu_ops": lt.n_gpu_ops,
                    "gpu_busy_ns": lt.gpu_busy_ns,
                    "exclusive_gpu_ns": lt.exclusive_gpu_ns,
                }
                for lt in self.layers.values()
            ],
            "attribution_coverage_frac": self.attribution_coverage_frac,
            "counts": {k: v for k, v in self.counts.items() if k.isupper()},
        }


def device_truth(ops: list[GpuOp], device_id: int, pid: int | None) -> DeviceTruth:
    """Generic numbers for the ops of one device (and process), from the planted records."""
    ops = [o for o in ops if o.device_id == device_id and (pid is None or o.pid == pid)]
    spans = [(o.start_ns, o.end_ns) for o in ops]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)

    def of(*classes: str) -> list[Interval]:
        return [(o.start_ns, o.end_ns) for o in ops if o.op_class in classes]

    compute, nccl, h2d = of("compute"), of("nccl"), of("memcpy_h2d")
    return DeviceTruth(
        device_id=device_id,
        pid=pid,
        span=(lo, hi),
        busy_ns=total(spans),
        gaps=complement(spans, lo, hi),
        compute_ns=total(compute),
        nccl_ns=total(nccl),
        exposed_nccl_ns=total(nccl) - overlap(nccl, compute),
        h2d_ns=total(h2d),
        h2d_unoverlapped_ns=total(h2d) - overlap(h2d, compute),
        states=states(ops, lo, hi),
    )
