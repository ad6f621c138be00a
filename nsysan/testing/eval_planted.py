"""Planted traces of the evaluation corpus for the finding codes no training scenario plants
(`nsysan.testing.scenarios` covers starvation, exposed communication, launch-bound, pageable
copies and host syncs). Each builder is ``fn(path, **kw) -> path``; what it plants is in its
docstring, and the corpus labels (tests/eval/labels) follow from that.

Every trace is an NVTX-stepped loop of ``steps`` steps of 10 ms of queued compute (`_loop`),
plus the one symptom.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from nsysan.testing import kernels as K
from nsysan.testing._common import MS, US, flush, start
from nsysan.testing.synth import TraceBuilder

_STEP = 10 * MS


def _loop(b: TraceBuilder, g: int, steps: int, t0: int = 5 * MS, *,
          kernel=K.XMMA_GEMM, extra: Callable[[int, int], None] | None = None,
          nvtx: bool = True) -> int:
    """``steps`` steps of ten 1 ms kernels launched ahead; ``extra(i, step_start)`` adds the
    symptom of step i. Returns the end of the last step."""
    t = t0
    for i in range(steps):
        st = t
        launch = t - 600 * US
        for _ in range(10):
            b.add_kernel(g, t, t + 1 * MS - 2 * US, kernel, api_start=launch, api_ns=4 * US)
            launch += 50 * US
            t += 1 * MS
        if nvtx:
            b.add_nvtx_range(g, st - 700 * US, launch + 10 * US, f"step {i}")
        if extra is not None:
            t = max(t, extra(i, st) or t)
    return t


def h2d_exposed(path: str | Path, *, layout: str = "2022.4", steps: int = 12) -> Path:
    """After each step's compute a 2 ms pinned, asynchronous H2D copy runs alone (the next
    batch is uploaded only when compute is done): ~2 / 12 ms of device time exposed."""
    b, g = start()

    def extra(i: int, st: int) -> int:
        s = st + _STEP
        b.add_memcpy(g, s, s + 2 * MS, nbytes=32 << 20, src="pinned",
                     api_start=s - 300 * US)
        return s + 2 * MS

    end = _loop(b, g, steps, extra=extra)
    flush(b, g, end)
    return b.write(Path(path), layout)


def memory_churn(path: str | Path, *, layout: str = "2022.4", steps: int = 12) -> Path:
    """Every step calls cudaMalloc and cudaFree (400 us each) while its kernels run: the
    caching allocator is bypassed (e.g. `empty_cache()` in the loop)."""
    b, g = start()

    def extra(i: int, st: int) -> None:
        b.add_api(g, st + 1 * MS, st + 1_400 * US, "cudaMalloc_v3020")
        b.add_api(g, st + 5 * MS, st + 5_400 * US, "cudaFree_v3020")

    end = _loop(b, g, steps, extra=extra)
    flush(b, g, end)
    return b.write(Path(path), layout)


def no_tensor_cores(path: str | Path, *, layout: str = "2022.4", steps: int = 8) -> Path:
    """Every kernel is the fp32 SIMT ``ampere_sgemm`` (a matrix multiply without Tensor
    Cores): 100% of compute time."""
    b, g = start()
    end = _loop(b, g, steps, kernel=K.SGEMM)
    flush(b, g, end)
    return b.write(Path(path), layout)


def slow_start(path: str | Path, *, layout: str = "2022.4", steps: int = 8) -> Path:
    """The first CUDA call (context creation in ``cudaFree``) comes at 1 ms, the first
    kernel 8 s later (data set loading on the host), then a healthy loop."""
    b, g = start()
    b.add_api(g, 1 * MS, 300 * MS, "cudaFree_v3020")
    end = _loop(b, g, steps, t0=8_000 * MS)
    flush(b, g, end)
    return b.write(Path(path), layout)


def graph_without_nodes(path: str | Path, *, layout: str = "2022.4", steps: int = 8) -> Path:
    """A loop that also launches a CUDA graph every step, traced without its nodes (no
    kernel carries a graph node id: `--cuda-graph-trace=graph`)."""
    b, g = start()

    def extra(i: int, st: int) -> None:
        b.add_api(g, st + 2 * MS, st + 2 * MS + 20 * US, "cudaGraphLaunch_v10000")

    end = _loop(b, g, steps, extra=extra)
    flush(b, g, end)
    return b.write(Path(path), layout)


def truncated(path: str | Path, *, layout: str = "2022.4", steps: int = 10,
              lost_every: int = 2) -> Path:
    """A loop where every ``lost_every``-th step also issues one kernel launch whose GPU record
    is missing (CUPTI dropped it), in the middle of the capture."""
    b, g = start()

    def extra(i: int, st: int) -> None:
        if i % lost_every == 1:
            b.add_api(g, st + 3 * MS, st + 3 * MS + 5 * US, "cudaLaunchKernel_v7000")

    end = _loop(b, g, steps, extra=extra)
    flush(b, g, end)
    return b.write(Path(path), layout)


def nvtx_sparse(path: str | Path, *, layout: str = "2022.4", steps: int = 10) -> Path:
    """A loop without step ranges where only one NVTX range (``eval_hook``) encloses the
    launches of the first step's kernels: 10% of GPU time is attributed."""
    b, g = start()
    end = _loop(b, g, steps, nvtx=False)
    b.add_nvtx_range(g, 5 * MS - 700 * US, 5 * MS - 600 * US + 10 * 50 * US, "eval_hook")
    flush(b, g, end)
    return b.write(Path(path), layout)


def balanced_layers(path: str | Path, *, layout: str = "2022.4", steps: int = 8,
                    heavy_layer: int | None = None) -> Path:
    """A loop whose kernels are launched inside four NVTX layer ranges of equal GPU time
    (``layer0`` .. ``layer3``, 25% each), inside ``step N`` ranges. With ``heavy_layer`` that
    layer's kernels take 4.8 ms instead of 0.8 ms: it holds 14.4 / 21.6 = 67% of GPU time."""
    b, g = start()
    t = 5 * MS
    for i in range(steps):
        st = t
        launch = t - 600 * US
        for layer in range(4):
            l0 = launch
            d = 4_800 * US if layer == heavy_layer else 800 * US
            for _ in range(3):
                b.add_kernel(g, t, t + d, K.XMMA_GEMM, api_start=launch, api_ns=4 * US)
                launch += 30 * US
                t += d
            b.add_nvtx_range(g, l0 - 2 * US, launch - 20 * US, f"layer{layer}")
        b.add_nvtx_range(g, st - 700 * US, launch + 10 * US, f"step {i}")
    flush(b, g, t)
    return b.write(Path(path), layout)


def unterminated_range(path: str | Path, *, layout: str = "2022.4", steps: int = 8) -> Path:
    """A healthy loop plus one NVTX range ``profile_window`` opened before it that is never
    closed (its end is NULL in the export)."""
    b, g = start()
    end = _loop(b, g, steps)
    b.add_nvtx_range(g, 1 * MS, end, "profile_window")
    flush(b, g, end)
    out = b.write(Path(path), layout)
    with sqlite3.connect(out) as con:
        text = "text = 'profile_window'"
        sid = con.execute("SELECT id FROM StringIds WHERE value = 'profile_window'").fetchone()
        if sid is not None:
            text = f"(text = 'profile_window' OR textId = {sid[0]})"
        con.execute(f"UPDATE NVTX_EVENTS SET end = NULL WHERE {text}")
    return out


def impossible_rows(path: str | Path, *, layout: str = "2022.4", steps: int = 8,
                    every: int = 5) -> Path:
    """A healthy loop whose export was damaged afterwards: every ``every``-th kernel row ends
    before it starts (20% impossible rows)."""
    b, g = start()
    end = _loop(b, g, steps)
    flush(b, g, end)
    out = b.write(Path(path), layout)
    with sqlite3.connect(out) as con:
        con.execute(f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 1000 '
                    f"WHERE rowid % {every} = 0")
    return out


def with_osrt(path: str | Path, *, layout: str = "2022.4", steps: int = 8) -> Path:
    """A healthy NVTX-stepped loop captured with OS-runtime tracing (a short ``poll`` on the
    main thread every step): every table the analysis reads is there."""
    b, g = start()

    def extra(i: int, st: int) -> None:
        b.add_osrt(g, st + 2 * MS, st + 2 * MS + 50 * US, "poll")

    end = _loop(b, g, steps, extra=extra)
    flush(b, g, end)
    return b.write(Path(path), layout)


def straggler_job(directory: str | Path, **kw) -> Path:
    """A 2-rank DDP job (`nsysan.multirank.synth`): rank 1 loads data late every 2nd step,
    so the other rank waits for it at the AllReduce."""
    from nsysan.multirank.synth import StragglerJob, write_straggler_job

    job = StragglerJob(**{"n_ranks": 2, "n_steps": 8, "straggler": 1, "period": 2,
                          "phase": 0, **kw})
    write_straggler_job(directory, job)
    return Path(directory)


def even_job(directory: str | Path, **kw) -> Path:
    """A 3-rank job where no rank is late: no straggler, no start-up skew."""
    from nsysan.multirank.synth import StragglerJob, write_straggler_job

    write_straggler_job(directory, StragglerJob(**{"n_ranks": 3, "n_steps": 6,
                                                   "straggler": -1, **kw}))
    return Path(directory)


def late_start_job(directory: str | Path, **kw) -> Path:
    """A 3-rank job whose rank 1 starts 900 ms late (slow initialisation)."""
    from nsysan.multirank.synth import StragglerJob, write_straggler_job

    write_straggler_job(directory, StragglerJob(**{
        "n_ranks": 3, "n_steps": 6, "straggler": -1, "late_start_rank": 1,
        "late_start_ns": 900 * MS, **kw}))
    return Path(directory)


def nccl_allreduce(path: str | Path, *, layout: str = "2022.4", steps: int = 8,
                   allreduce_ns: int = 20 * MS, nbytes: int = 64 << 20) -> Path:
    """A 4-rank DDP loop (this rank's profile): each step's 64 MiB AllReduce runs on its own
    stream beside the compute, launched inside NCCL's NVTX range ``ncclAllReduce`` whose
    payload gives the message size and rank count (as NCCL >= 2.19 with nsys 2024+ records).
    With the default 20 ms per AllReduce the bus bandwidth is 64 MiB / 20 ms x 2(n-1)/n =
    5.0 GB/s; with 1 ms it is 101 GB/s."""
    b, g = start()
    b.add_nvtx_range(g, 1 * MS, 2 * MS, "ncclCommInitRank", domain="NCCL")
    t = 5 * MS
    for i in range(steps):
        st = t
        launch = t - 600 * US
        b.add_kernel(g, t, t + allreduce_ns, K.NCCL_ALLREDUCE_OLD, stream_id=21,
                     api_start=launch - 40 * US, api_ns=4 * US)
        b.add_nvtx_range(g, launch - 45 * US, launch - 30 * US, "ncclAllReduce", domain="NCCL")
        for _ in range(max(10, allreduce_ns // MS + 2)):
            b.add_kernel(g, t, t + 1 * MS - 2 * US, K.XMMA_GEMM, api_start=launch, api_ns=4 * US)
            launch += 50 * US
            t += 1 * MS
        b.add_nvtx_range(g, st - 700 * US, launch + 10 * US, f"step {i}")
    flush(b, g, t)
    out = b.write(Path(path), layout)
    with sqlite3.connect(out) as con:
        payload = f'{{"Message size [bytes]": {nbytes}, "No. of ranks": 4}}'
        sid = con.execute("SELECT id FROM StringIds WHERE value = 'ncclAllReduce'").fetchone()
        cond = "text = 'ncclAllReduce'" + (f" OR textId = {sid[0]}" if sid else "")
        con.execute(f"UPDATE NVTX_EVENTS SET jsonText = ? WHERE {cond}", (payload,))
        sid = con.execute("SELECT id FROM StringIds WHERE value = 'ncclCommInitRank'").fetchone()
        cond = "text = 'ncclCommInitRank'" + (f" OR textId = {sid[0]}" if sid else "")
        con.execute(f"UPDATE NVTX_EVENTS SET jsonText = ? WHERE {cond}",
                    ('{"No. of ranks": 4, "Rank": 0}',))
    return out
