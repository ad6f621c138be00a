"""Two ranks in one report, one GPU each, with a straggler."""

from __future__ import annotations

import random
from pathlib import Path

from nsysan.testing import kernels as K
from nsysan.testing._common import MS, US, finish, flush, gap_truth
from nsysan.testing._loop import Loop
from nsysan.testing._step import BWD, FWD, Step, exposed_optimizer, last_compute
from nsysan.testing.synth import TraceBuilder
from nsysan.testing.truth import GapTruth, PlantedTruth


def multi_device(
    path: str | Path,
    layout: str = "2022.4",
    *,
    seed: int = 0,
    lazy: bool = True,
    steps: int = 6,
    straggler_step: int = 3,
    stall_ns: int = 12 * MS,
    exposed_ns: int = 1_500 * US,
) -> tuple[Path, PlantedTruth]:
    """Two ranks in one report (torchrun): pid 6101 on device 0, pid 6102 on device 1.
    Correlation, context and stream ids collide across the two processes. Rank 1 starves for
    ``stall_ns`` at ``straggler_step``; rank 0 then waits inside its AllReduce kernel, which
    ends on both ranks at the same time (the collective)."""
    b = TraceBuilder(command=("torchrun", "--nproc_per_node=2", "train.py"))
    loops = []
    for rank, pid in enumerate((6101, 6102)):
        gtid = b.add_process(pid, "python", main_thread="python")
        b.add_gpu(rank)
        loops.append(Loop(b, gtid, random.Random(seed * 31 + rank), device_id=rank))
    step_ranges: list[tuple[int, int]] = []
    planted: list[GapTruth] = []
    exposed: dict[int, list[int]] = {0: [], 1: []}
    for i in range(steps):
        st, lasts = [], []
        for rank, loop in enumerate(loops):
            s = Step(loop, i, loop.rng)
            s.overlapped_allreduce = K.NCCL_ALLREDUCE_NEW
            stall = rank == 1 and i == straggler_step
            drained = loop.drain()
            s.data(stall_until=drained + stall_ns if stall else None)
            fwd = s.kernels(FWD, "forward")
            if stall:
                planted.append(
                    gap_truth(
                        b,
                        (drained, fwd[0].start_ns),
                        pid=6102,
                        device_id=1,
                        cause="nvtx_range",
                        step=i,
                        detail="DataLoader.__next__",
                        gtid=loop.gtid,
                    )
                )
            bwd = s.kernels(BWD, "backward")
            lasts.append(last_compute(bwd))
            st.append(s)
        end = max(o.end_ns for o in lasts) + exposed_ns  # the collective ends together
        for rank, (s, last) in enumerate(zip(st, lasts, strict=True)):
            exposed_optimizer(s, K.NCCL_ALLREDUCE_NEW, last, end)
            exposed[rank].append(end - last.end_ns)
            r = s.close()
            if rank == 0:
                step_ranges.append(r)
    for loop in loops:
        flush(b, loop.gtid, loop.host)
    return finish(
        "multi_device",
        b,
        Path(path),
        layout,
        lazy,
        seed,
        steps=step_ranges,
        planted_gaps=planted,
        exposed_nccl_per_step_ns=exposed,
        extra={"pids": {0: 6101, 1: 6102}, "straggler_step": straggler_step},
    )
