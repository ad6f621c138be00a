"""A synthetic data-parallel job with planted truth: one straggler rank and one bad clock.

Every rank runs the same training loop (true job time, ns): a ``train_step`` NVTX range; a
``DataLoader.next`` range (data loading); a compute kernel; an ``ncclAllReduce`` range that
launches an NCCL AllReduce kernel on its own stream, which starts when the rank's compute is
done (its *arrival*) and ends ``comm_ns`` after the last rank arrived (plus a few
microseconds of jitter); the host then blocks in ``cudaStreamSynchronize`` until it ends.
The straggler's data loading takes ``slow_ns`` longer at every step ``i`` with
``i % period == phase``. Each rank's profile starts at its own session start, and the clock of
``offset_rank`` is off by ``clock_error_ns``: its recorded session start (UTC) is that much
later than the truth, which session-start alignment alone cannot see. Optionally
``late_start_rank`` starts late (its first data loading takes ``late_start_ns`` longer).

The profiles are written with `nsysan.testing.synth.TraceBuilder` as real nsys 2022.4 SQLite
exports named ``<prefix>_rank<r>.sqlite`` (the file name is how the ranks are identified).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from nsysan.testing._model import KernelName
from nsysan.testing.synth import TraceBuilder

COMPUTE = KernelName("void gemm_kernel<float>(float const*, float*)", "gemm_kernel")
ALLREDUCE = KernelName(
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
)


@dataclass(frozen=True)
class StragglerJob:
    """What was planted (all times in ns)."""

    n_ranks: int = 4
    n_steps: int = 24
    straggler: int = 2
    period: int = 4
    phase: int = 1
    slow_ns: int = 25_000_000
    offset_rank: int = 1
    clock_error_ns: int = 2_500_000
    load_ns: int = 2_000_000
    compute_ns: int = 12_000_000
    comm_ns: int = 500_000
    rank_start_gap_ns: int = 700_000  # session starts of consecutive ranks (true time)
    late_start_rank: int | None = None  # this rank's first data loading takes late_start_ns
    late_start_ns: int = 0
    seed: int = 7
    paths: list[Path] = field(default_factory=list)

    def session_start_true_ns(self, rank: int) -> int:
        return 1_700_000_000_000_000_000 + rank * self.rank_start_gap_ns


def write_straggler_job(directory: str | Path, job: StragglerJob | None = None,
                        prefix: str = "job") -> StragglerJob:
    """Write the job's profiles into ``directory``; returns the planted truth with ``paths``."""
    job = job or StragglerJob()
    rng = random.Random(job.seed)
    out = Path(directory)
    builders = []
    for r in range(job.n_ranks):
        err = job.clock_error_ns if r == job.offset_rank else 0
        b = TraceBuilder(session_start_utc_ns=job.session_start_true_ns(r) + err,
                         hostname=f"node{r // 8}", command=("python", "train.py"))
        pid = 4000 + r
        gtid = b.add_process(pid, "python")
        b.add_gpu(r, "NVIDIA A100-SXM4-80GB")
        builders.append((b, gtid))

    def local(r: int, t: int) -> int:
        return t - (job.session_start_true_ns(r) - job.session_start_true_ns(0))

    # The loop is over steps and ranks of a tiny synthetic job: test-data generation.
    t_prev_end = 50_000_000  # true time of the previous step's end, relative to rank 0's start
    for i in range(job.n_steps):
        arrivals = []
        plan = []
        for r in range(job.n_ranks):
            s = t_prev_end + 30_000 + rng.randrange(0, 30_000)
            load = job.load_ns + rng.randrange(0, 40_000)
            if r == job.straggler and i % job.period == job.phase:
                load += job.slow_ns
            if r == job.late_start_rank and i == 0:
                load += job.late_start_ns
            t1 = s + load
            c_end = t1 + 10_000 + job.compute_ns + rng.randrange(0, 60_000)
            arrivals.append(c_end)
            plan.append((s, t1, c_end))
        t_end = max(arrivals) + job.comm_ns
        ends = [t_end + rng.randrange(-2_000, 2_000) for _ in range(job.n_ranks)]
        for r, ((s, t1, c_end), end) in enumerate(zip(plan, ends, strict=True)):
            b, gtid = builders[r]
            step_end = end + 20_000
            b.add_nvtx_range(gtid, local(r, s), local(r, step_end), "train_step")
            b.add_nvtx_range(gtid, local(r, s), local(r, t1), "DataLoader.next")
            b.add_kernel(gtid, local(r, t1 + 10_000), local(r, c_end - 1), COMPUTE,
                         device_id=r, stream_id=7, api_start=local(r, t1), api_ns=5_000)
            b.add_nvtx_range(gtid, local(r, t1 + 6_000), local(r, t1 + 14_000),
                             "ncclAllReduce", domain="NCCL")
            b.add_kernel(gtid, local(r, c_end), local(r, end), ALLREDUCE, device_id=r,
                         stream_id=20, api_start=local(r, t1 + 8_000), api_ns=4_000)
            b.add_sync(gtid, local(r, t1 + 15_000), local(r, end + 10_000), kind="stream",
                       device_id=r, stream_id=20)
        t_prev_end = max(ends) + 20_000
    paths = [b.write(out / f"{prefix}_rank{r}.sqlite") for r, (b, _) in enumerate(builders)]
    return StragglerJob(**{**job.__dict__, "paths": paths})
