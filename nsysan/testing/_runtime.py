"""Runtime-layer scenarios: launch-bound loops, synchronous copies, syncs in the loop."""

from __future__ import annotations

import random
from pathlib import Path

from nsysan.testing import kernels as K
from nsysan.testing._common import US, dur, finish, flush, gap_truth, start
from nsysan.testing._loop import Loop
from nsysan.testing._step import BWD, FWD, STEP_PAD, Step
from nsysan.testing.truth import PlantedTruth


def launch_bound(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    steps: int = 8,
    per_step: int = 250,
) -> tuple[Path, PlantedTruth]:
    """Thousands of ~3 us kernels, each launched by a ~10 us cudaLaunchKernel: the GPU waits
    for launches (busy ~27 %), every gap is a few us, API time exceeds kernel time."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng, latency_ns=2 * US, host_gap_ns=1 * US)
    step_ranges = []
    for i in range(steps):
        m = loop.begin(5 * US)
        for j in range(per_step):
            k = K.FILL if j % 3 == 0 else K.ADD
            loop.kernel(
                k, 3 * US + rng.randint(-500, 500), gap=0, api_ns=10 * US + rng.randint(-800, 800)
            )
        ev = loop.end(m, f"step {i}", pad=5 * US)
        step_ranges.append((ev.start_ns, ev.end_ns))
        loop.idle(200 * US)  # Python between steps
    flush(b, gtid, loop.host)
    launches = [(a.start_ns, a.end_ns) for a in b.apis if a.name.startswith("cudaLaunch")]
    return finish(
        "launch_bound",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        extra={
            "n_kernels": len(b.ops),
            "launch_api_ns": sum(e - s for s, e in launches),
            "kernel_ns": sum(o.duration_ns for o in b.ops),
        },
    )


def pageable_copies(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    steps: int = 6,
) -> tuple[Path, PlantedTruth]:
    """Each step starts with a synchronous ``cudaMemcpy`` HtoD of 64 MiB from pageable
    memory (srcKind 0) and ends with a 4-byte synchronous DtoH (``loss.item()``): the GPU
    idles while the driver stages the pageable data, the host blocked in the call."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng)
    step_ranges, planted = [], []
    for i in range(steps):
        s = Step(loop, i, rng)
        drained = loop.drain() if loop.ops else None
        copy = loop.sync_copy(64 << 20, stage_ns=2_500 * US, dma_ns=5_200 * US, src="pageable")
        if drained is not None:
            planted.append(
                gap_truth(
                    b,
                    (drained, copy.start_ns),
                    pid=4242,
                    device_id=0,
                    cause="sync_copy",
                    step=i,
                    detail="cudaMemcpy HtoD, pageable",
                    gtid=gtid,
                )
            )
        s.kernels(FWD[:8], "forward")
        s.kernels(BWD[:8], "backward")
        loop.sync_copy(4, stage_ns=5 * US, dma_ns=2 * US, kind="DtoH", src="device", dst="pageable")
        step_ranges.append(s.close())
    flush(b, gtid, loop.host)
    copies = [o for o in b.ops if o.kind == "memcpy"]
    return finish(
        "pageable_copies",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        planted_gaps=planted,
        extra={
            "n_sync_copies": len(copies),
            "n_pageable_htod": sum(1 for o in copies if o.src_kind == "pageable"),
            "pageable_htod_bytes": sum(o.bytes for o in copies if o.src_kind == "pageable"),
            "copy_ns": sum(o.duration_ns for o in copies),
        },
    )


def sync_in_loop(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    steps: int = 10,
    wake_ns: int = 1_500 * US,
) -> tuple[Path, PlantedTruth]:
    """The host queues a whole step ahead, then blocks in ``cudaDeviceSynchronize`` (even
    steps) or ``cudaStreamSynchronize`` (odd steps) until the GPU drains plus ``wake_ns``
    (a blocking-sync wake-up on a loaded host); the GPU idles from the drain until the next
    step's first kernel."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng, lead_ns=10**12)  # no queue limit: the host runs a step ahead
    step_ranges, planted, pending = [], [], None
    plan = FWD[:6] + BWD[:6]
    for i in range(steps):
        m = loop.begin(STEP_PAD)
        ops = [loop.kernel(k, dur(rng, base)) for k, base in plan]
        if pending is not None:
            drained, kind = pending
            planted.append(
                gap_truth(
                    b,
                    (drained, ops[0].start_ns),
                    pid=4242,
                    device_id=0,
                    cause="sync_api",
                    step=i - 1,
                    detail=kind,
                    gtid=gtid,
                )
            )
        kind = "context" if i % 2 == 0 else "stream"
        drained = loop.drain()
        loop.sync(kind, wake_ns)
        pending = (drained, b.syncs[-1].api.name)
        ev = loop.end(m, f"step {i}", pad=STEP_PAD)
        step_ranges.append((ev.start_ns, ev.end_ns))
    flush(b, gtid, loop.host)
    return finish(
        "sync_in_loop",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        planted_gaps=planted,
        extra={"wake_ns": wake_ns, "n_syncs": len(b.syncs)},
    )
