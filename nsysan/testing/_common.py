"""Helpers shared by the scenarios: building blocks and the truth they return."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from nsysan.testing.synth import TraceBuilder
from nsysan.testing.truth import GapTruth, KernelTruth, PlantedTruth, device_truth, overlap

MS = 1_000_000
US = 1_000


def dur(rng: random.Random, base: int) -> int:
    return int(base * (1 + rng.uniform(-0.03, 0.03)))


def gap_truth(
    b: TraceBuilder,
    gap: tuple[int, int],
    *,
    pid: int,
    device_id: int,
    cause: str,
    step: int,
    detail: str,
    gtid: int,
) -> GapTruth:
    """What the launching thread did during a planted gap, measured on the planted events."""
    on_thread = [a for a in b.apis if a.global_tid == gtid]
    syncs = {s.api.seq for s in b.syncs}
    sync_copies = {o.api.seq for o in b.ops if o.api and o.api.name == "cudaMemcpy_v3020"}
    launches = [(a.start_ns, a.end_ns) for a in on_thread if "Launch" in a.name]
    ranges = [e for e in b.nvtx if e.global_tid == gtid and e.end_ns is not None]
    covering: dict[str, int] = {}
    for e in ranges:
        assert e.end_ns is not None
        n = overlap([gap], [(e.start_ns, e.end_ns)])
        if n:
            covering[e.name] = covering.get(e.name, 0) + n
    non_step = [
        (e.start_ns, e.end_ns or e.start_ns) for e in ranges if not e.name.startswith("step ")
    ]
    return GapTruth(
        device_id=device_id,
        pid=pid,
        start_ns=gap[0],
        end_ns=gap[1],
        cause=cause,
        step=step,
        sync_api_ns=overlap([gap], [(a.start_ns, a.end_ns) for a in on_thread if a.seq in syncs]),
        sync_copy_ns=overlap(
            [gap], [(a.start_ns, a.end_ns) for a in on_thread if a.seq in sync_copies]
        ),
        launch_ns=overlap([gap], launches),
        osrt_ns=overlap([gap], [(e.start_ns, e.end_ns) for e in b.osrt if e.global_tid == gtid]),
        nvtx_ns=overlap([gap], non_step),
        detail=detail,
        ranges=covering,
    )


def finish(
    name: str, b: TraceBuilder, path: Path, layout: str, lazy: bool, seed: int, **fields: Any
) -> tuple[Path, PlantedTruth]:
    path = b.write(path, layout, lazy=lazy)
    devices = {d: device_truth(b.ops, d, None) for d in sorted({o.device_id for o in b.ops})}
    pdevs = {
        (p, d): device_truth(b.ops, d, p) for p, d in sorted({(o.pid, o.device_id) for o in b.ops})
    }
    kern: dict[str, KernelTruth] = {}
    for op in b.ops:
        if op.kernel is None:
            continue
        k = op.kernel
        t = kern.setdefault(
            k.demangled, KernelTruth(k.demangled, k.short, k.op_class, 0, 0, 1 << 62, 0)
        )
        t.count += 1
        t.total_ns += op.duration_ns
        t.min_ns = min(t.min_ns, op.duration_ns)
        t.max_ns = max(t.max_ns, op.duration_ns)
    truth = PlantedTruth(
        scenario=name,
        path=path,
        layout=layout,
        seed=seed,
        duration_ns=b.duration_ns,
        session_start_utc_ns=b.session_start_utc_ns,
        devices=devices,
        process_devices=pdevs,
        kernels=kern,
        counts=counts(b),
        **fields,
    )
    return path, truth


def counts(b: TraceBuilder) -> dict[str, int]:
    kinds = [o.kind for o in b.ops]
    domains = {(e.pid, e.domain) for e in b.nvtx if e.domain is not None}
    osrt_procs = {(e.global_tid >> 24) & 0xFFFFFF for e in b.osrt}
    return {
        "CUPTI_ACTIVITY_KIND_KERNEL": kinds.count("kernel"),
        "CUPTI_ACTIVITY_KIND_MEMCPY": kinds.count("memcpy"),
        "CUPTI_ACTIVITY_KIND_MEMSET": kinds.count("memset"),
        "CUPTI_ACTIVITY_KIND_RUNTIME": len(b.apis),
        "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": len(b.syncs),
        "NVTX_EVENTS": len(b.nvtx) + len(domains),
        "OSRT_API": len(b.osrt) + 2 * len(osrt_procs),  # + started / finished markers
        "PROFILER_OVERHEAD": len(b.overhead),
        "nvtx_ranges": sum(1 for e in b.nvtx if e.end_ns is not None),
        "nvtx_marks": sum(1 for e in b.nvtx if e.end_ns is None),
        "nvtx_domains": len(domains),
    }


def start(pid: int = 4242, **kw: Any) -> tuple[TraceBuilder, int]:
    b = TraceBuilder(**kw)
    gtid = b.add_process(pid, "python", main_thread="python")
    b.add_gpu(0)
    return b, gtid


def flush(b: TraceBuilder, gtid: int, t: int) -> None:
    """The end-of-capture CUDA flush nsys records (outside the GPU span)."""
    b.add_overhead(gtid, t + 200 * US, t + 1_200 * US)
