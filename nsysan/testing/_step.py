"""`Step`: one training iteration (data, forward, backward, optimizer) on a `Loop`."""

from __future__ import annotations

import random

from nsysan.testing import kernels as K
from nsysan.testing._common import MS, US, dur
from nsysan.testing._loop import API_NS, Loop
from nsysan.testing._model import GpuOp, KernelName, NvtxEvent

NCCL_STREAM = 20
COPY_STREAM = 24
STEP_PAD = 50 * US
SECTION_PAD = 20 * US

FWD = [(K.XMMA_GEMM, 1_000 * US), (K.BATCHNORM, 450 * US), (K.ADD, 300 * US)] * 4 + [
    (K.CUTLASS_GEMM, 900 * US)
] * 4
BWD = [
    (K.SGEMM, 1_100 * US),
    (K.XMMA_GEMM, 1_000 * US),
    (K.REDUCE, 400 * US),
    (K.ADD, 300 * US),
] * 6
OPT = [(K.ADAM, 600 * US), (K.FILL, 60 * US)] * 4
BUCKETS = (4, 12, 20)  # backward kernels (all SGEMM) that hide an overlapped AllReduce


# -- the common training step -----------------------------------------------------------------
class Step:
    """One training iteration on a `Loop`; collects what truth needs."""

    def __init__(self, loop: Loop, idx: int, rng: random.Random):
        self.loop, self.idx, self.rng = loop, idx, rng
        self.mark = loop.begin(STEP_PAD)

    def data(self, stall_until: int | None = None) -> NvtxEvent:
        """``DataLoader.__next__``: 60 us when the batch is ready, else OS-runtime waits
        until the host can launch the step's first kernel exactly at ``stall_until``."""
        loop = self.loop
        m = loop.begin()
        if stall_until is None:
            loop.idle(60 * US)
            ev = loop.end(m, "DataLoader.__next__")
        else:
            end = stall_until - loop.latency_ns - API_NS - loop.host_gap_ns - SECTION_PAD
            calls = [("poll", 4 * MS, 0), ("futex", 2_500 * US, 0)]
            i = 0
            while loop.host + 3 * US + calls[i % 2][1] < end - 200 * US:
                loop.osrt(calls[i % 2][0], calls[i % 2][1], return_value=calls[i % 2][2])
                i += 1
            loop.osrt("read", 150 * US, return_value=4096)
            ev = loop.end(m, "DataLoader.__next__", until=end)
        return ev

    def kernels(self, plan: list[tuple[KernelName, int]], name: str, **kw) -> list[GpuOp]:
        loop = self.loop
        m = loop.begin(SECTION_PAD)
        ops = []
        for i, (k, base) in enumerate(plan):
            op = loop.kernel(k, dur(self.rng, base), **kw)
            ops.append(op)
            side = self._after_kernel(name, i, op)
            if side is not None:
                ops.append(side)
        loop.end(m, name, pad=SECTION_PAD)
        return ops

    # hooks set by scenarios
    overlapped_allreduce: KernelName | None = None
    h2d_prefetch: bool = False

    def _after_kernel(self, section: str, i: int, op: GpuOp) -> GpuOp | None:
        loop = self.loop
        if section == "forward" and i == 0 and self.h2d_prefetch:
            # the next batch, pinned, on a copy stream, hidden under this kernel
            return loop.side_copy(op.start_ns + 100 * US, 400 * US, COPY_STREAM, nbytes=8 << 20)
        if section == "backward" and i in BUCKETS and self.overlapped_allreduce is not None:
            return self.allreduce(self.overlapped_allreduce, op.start_ns + 100 * US, 700 * US)
        return None

    def allreduce(self, k: KernelName, start: int, dur: int) -> GpuOp:
        loop = self.loop
        m = loop.begin(2 * US)
        driver = k.short.startswith("ncclDev")
        op = loop.side_kernel(
            k,
            start,
            dur,
            NCCL_STREAM,
            driver=driver,
            api_name="cuLaunchKernelEx" if driver else "cudaLaunchKernel_v7000",
        )
        loop.end(m, "ncclAllReduce", pad=2 * US, domain="NCCL")
        return op

    def close(self) -> tuple[int, int]:
        """End the step's range; returns its (start, end)."""
        ev = self.loop.end(self.mark, f"step {self.idx}", pad=STEP_PAD)
        assert ev.end_ns is not None
        return ev.start_ns, ev.end_ns


# -- scenarios --------------------------------------------------------------------------------


def last_compute(ops: list[GpuOp]) -> GpuOp:
    return max((o for o in ops if o.op_class == "compute"), key=lambda o: o.end_ns)


def exposed_optimizer(s: Step, k: KernelName, last: GpuOp, end: int) -> GpuOp:
    """The last gradient bucket's AllReduce starts under the last backward kernel ``last``
    and runs to ``end``; the optimizer section waits for it (cudaStreamWaitEvent), so the
    AllReduce is exposed from ``last.end_ns`` to ``end``. Returns the AllReduce kernel."""
    loop = s.loop
    m = loop.begin(SECTION_PAD)
    tail = s.allreduce(k, last.start_ns + 100 * US, end - last.start_ns - 100 * US)
    loop.wait_for(tail)
    for kern, base in OPT:
        loop.kernel(kern, dur(loop.rng, base))
    loop.end(m, "optimizer", pad=SECTION_PAD)
    return tail
