"""Named training pathologies as synthetic nsys exports, each with its `PlantedTruth`.

Every scenario is deterministic for a given seed (jitter comes from ``random.Random(seed)``),
writes a file of a few hundred kB at most in well under a second, and returns
``(path, truth)``. Truth is taken from how the scenario placed its events (see `_loop`) and
from the naive oracle in `truth`; never from nsysan's own code.

    path, truth = build("starved_input", tmp_path, layout="2023.4")
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsysan.errors import ConfigError
from nsysan.testing import kernels as K
from nsysan.testing._common import MS, US, finish, flush, gap_truth, start
from nsysan.testing._layers import layers
from nsysan.testing._loop import Loop
from nsysan.testing._multi import multi_device
from nsysan.testing._runtime import launch_bound, pageable_copies, sync_in_loop
from nsysan.testing._step import (
    BWD,
    FWD,
    OPT,
    SECTION_PAD,
    Step,
    exposed_optimizer,
    last_compute,
)
from nsysan.testing.truth import PlantedTruth


def healthy(
    path: str | Path, layout: str = "2022.4", *, seed: int = 0, lazy: bool = True, steps: int = 8
) -> tuple[Path, PlantedTruth]:
    """GPU-bound training: ~97 % busy, AllReduce and pinned H2D prefetch fully hidden under
    compute, every idle interval well under 1 ms."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng)
    step_ranges = []
    for i in range(steps):
        s = Step(loop, i, rng)
        s.overlapped_allreduce, s.h2d_prefetch = K.NCCL_ALLREDUCE_OLD, True
        s.data()
        s.kernels(FWD, "forward")
        s.kernels(BWD, "backward")
        s.kernels(OPT, "optimizer")
        step_ranges.append(s.close())
    flush(b, gtid, loop.host)
    return finish(
        "healthy",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        exposed_nccl_per_step_ns={0: [0] * steps},
    )


def starved_input(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    steps: int = 10,
    every: int = 3,
    stall_ns: int = 25 * MS,
    exposed_ns: int = 0,
) -> tuple[Path, PlantedTruth]:
    """Every ``every``-th step (3, 6, 9, ...) the GPU idles exactly ``stall_ns`` before the
    step's first kernel while the main thread sits in ``DataLoader.__next__`` (poll / futex /
    read). With ``exposed_ns`` > 0 it is also a DDP job: bucketed AllReduce hidden under
    backward and a last bucket exposed for ``exposed_ns`` every step."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng)
    step_ranges, planted, exposed = [], [], []
    for i in range(steps):
        s = Step(loop, i, rng)
        s.h2d_prefetch = True
        if exposed_ns:
            s.overlapped_allreduce = K.NCCL_ALLREDUCE_OLD
        stalled = i > 0 and i % every == 0
        drained = loop.drain()
        s.data(stall_until=drained + stall_ns if stalled else None)
        ops = s.kernels(FWD, "forward")
        if stalled:
            assert ops[0].start_ns == drained + stall_ns
            planted.append(
                gap_truth(
                    b,
                    (drained, ops[0].start_ns),
                    pid=4242,
                    device_id=0,
                    cause="nvtx_range",
                    step=i,
                    detail="DataLoader.__next__ (poll, futex, read)",
                    gtid=gtid,
                )
            )
        bwd = s.kernels(BWD, "backward")
        if exposed_ns:
            last = last_compute(bwd)
            exposed_optimizer(s, K.NCCL_ALLREDUCE_OLD, last, last.end_ns + exposed_ns)
        else:
            s.kernels(OPT, "optimizer")
        exposed.append(exposed_ns)
        step_ranges.append(s.close())
    flush(b, gtid, loop.host)
    return finish(
        "starved_input",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        planted_gaps=planted,
        exposed_nccl_per_step_ns={0: exposed},
        extra={"stall_ns": stall_ns, "stalled_steps": [g.step for g in planted]},
    )


def exposed_allreduce(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    steps: int = 8,
    exposed_ns: int = 4 * MS,
) -> tuple[Path, PlantedTruth]:
    """Bucketed AllReduce hidden under backward, plus a last bucket whose AllReduce runs
    ``exposed_ns`` (+ up to 1 ms, per step) past the end of backward with compute idle."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng)
    step_ranges, exposed = [], []
    for i in range(steps):
        s = Step(loop, i, rng)
        s.overlapped_allreduce = K.NCCL_ALLREDUCE_NEW
        s.data()
        s.kernels(FWD, "forward")
        last = last_compute(s.kernels(BWD, "backward"))
        x = exposed_ns + rng.randint(0, 1_000) * US
        exposed_optimizer(s, K.NCCL_ALLREDUCE_NEW, last, last.end_ns + x)
        exposed.append(x)
        step_ranges.append(s.close())
    flush(b, gtid, loop.host)
    return finish(
        "exposed_allreduce",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        exposed_nccl_per_step_ns={0: exposed},
        extra={"exposed_nccl_total_ns": sum(exposed)},
    )


def comm_gap_180ms(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    steps: int = 4,
    comm_ns: int = 180 * MS,
) -> tuple[Path, PlantedTruth]:
    """The classic "180 ms communication gap at the end of every step": after the
    optimizer an AllReduce kernel runs ``comm_ns`` with no compute at all, while the host
    waits in ``cudaStreamSynchronize`` (``loss.item()``)."""
    rng = random.Random(seed)
    b, gtid = start()
    loop = Loop(b, gtid, rng)
    step_ranges = []
    for i in range(steps):
        s = Step(loop, i, rng)
        s.data()
        s.kernels(FWD, "forward")
        s.kernels(BWD, "backward")
        opt = s.kernels(OPT, "optimizer")
        m = loop.begin(SECTION_PAD)
        comm = s.allreduce(K.NCCL_ALLREDUCE_OLD, opt[-1].end_ns + 10 * US, comm_ns)
        loop.wait_for(comm)
        loop.sync("stream", wake_ns=30 * US)
        loop.end(m, "loss.item", pad=SECTION_PAD)
        step_ranges.append(s.close())
    flush(b, gtid, loop.host)
    return finish(
        "comm_gap_180ms",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        exposed_nccl_per_step_ns={0: [comm_ns] * steps},
        extra={"comm_ns": comm_ns},
    )


SCENARIOS: dict[str, Callable[..., tuple[Path, PlantedTruth]]] = {
    "healthy": healthy,
    "starved_input": starved_input,
    "exposed_allreduce": exposed_allreduce,
    "comm_gap_180ms": comm_gap_180ms,
    "launch_bound": launch_bound,
    "pageable_copies": pageable_copies,
    "sync_in_loop": sync_in_loop,
    "multi_device": multi_device,
    "layers": layers,
}


def build(
    name: str, directory: str | Path, layout: str = "2022.4", **kw: Any
) -> tuple[Path, PlantedTruth]:
    """Build scenario ``name`` as ``<directory>/<name>-<layout>.sqlite``."""
    if name not in SCENARIOS:
        raise ConfigError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name](Path(directory) / f"{name}-{layout}.sqlite", layout, **kw)


__all__ = ["SCENARIOS", "build", *SCENARIOS]
