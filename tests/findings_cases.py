"""Hand-built inputs for the findings tests: canonical frames plus pass tables that conform to
the output schemas, built directly (not by the passes), so each rule is tested in isolation.

`Case` collects GPU ops, CUDA API calls and NVTX ranges; `build` returns ``(trace, results)``
with the tables the rules read: overlap (per device and per step, from a brute interval
sweep), gaps (device idle >= 1 ms with the cause the test planted), steps, kernels, layers.
The scenario functions at the bottom each plant one symptom in sixteen 10 ms steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import polars as pl

from nsysan.frames import intervals, schemas
from nsysan.frames.schemas import OVERLAP_CLASS_OF_OP_CLASS
from nsysan.frames.trace import Trace
from nsysan.passes.base import PassResult

MS = 1_000_000
US = 1_000
PID = 100
GPID = PID << 24
TID = 101
CLASSES = ("compute", "nccl", "h2d", "d2h", "d2d", "p2p", "memset")


class Case:
    def __init__(self) -> None:
        self.ops: list[dict] = []
        self.apis: list[dict] = []
        self.nvtx: list[dict] = []
        self.causes: list[tuple[int, int, str, str]] = []
        self.tensor_core: dict[str, bool | None] = {}
        self.layers: pl.DataFrame | None = None
        self._corr = 0

    def _next(self) -> int:
        self._corr += 1
        return self._corr

    def api(self, name: str, cls: str, start: int, end: int, corr: int | None = None,
            rv: int = 0) -> int:
        corr = self._next() if corr is None else corr
        self.apis.append(dict(start_ns=start, end_ns=end, global_tid=GPID + TID,
                              global_pid=GPID, pid=PID, tid=TID, correlation_id=corr,
                              name=name, api_class=cls, layer="runtime", return_value=rv))
        return corr

    def kernel(self, start: int, dur: int, name: str = "ampere_sgemm_128x64_nn",
               op_class: str = "compute", dev: int = 0, launch: int | None = None,
               api_dur: int = 4 * US, stream: int = 7) -> None:
        ls = start - 200 * US if launch is None else launch
        corr = self.api("cudaLaunchKernel", "launch", ls, ls + api_dur)
        self.ops.append(dict(kind="kernel", start_ns=start, end_ns=start + dur, global_pid=GPID,
                             pid=PID, device_id=dev, context_id=1, stream_id=stream,
                             correlation_id=corr, name=name, demangled_name=name,
                             op_class=op_class))

    def copy(self, start: int, dur: int, copy_kind: str = "HtoD", src: str = "pinned",
             dst: str = "device", nbytes: int = 8 << 20, api: str = "cudaMemcpyAsync",
             api_start: int | None = None, api_end: int | None = None, dev: int = 0,
             stream: int = 9) -> None:
        a0 = start - 100 * US if api_start is None else api_start
        a1 = a0 + 5 * US if api_end is None else api_end
        corr = self.api(api, "memcpy", a0, a1)
        cls = {"HtoD": "memcpy_h2d", "DtoH": "memcpy_d2h", "DtoD": "memcpy_d2d"}[copy_kind]
        self.ops.append(dict(kind="memcpy", start_ns=start, end_ns=start + dur, global_pid=GPID,
                             pid=PID, device_id=dev, context_id=1, stream_id=stream,
                             correlation_id=corr, name=copy_kind, demangled_name=copy_kind,
                             copy_kind=copy_kind, src_kind=src, dst_kind=dst, bytes=nbytes,
                             op_class=cls))

    def range(self, name: str, start: int, end: int, domain: str = "", payload: str | None = None,
              unterminated: bool = False) -> int:
        rid = len(self.nvtx) + 1
        self.nvtx.append(dict(range_id=rid, start_ns=start, end_ns=end, global_tid=GPID + TID,
                              global_pid=GPID, pid=PID, tid=TID, domain=domain, name=name,
                              style="push_pop", depth=0, unterminated=unterminated,
                              payload_json=payload))
        return rid

    def cause(self, start: int, end: int, cause: str, detail: str = "") -> None:
        """Gaps starting in [start, end) get this cause (else no_cuda_activity)."""
        self.causes.append((start, end, cause, detail))

    # ------------------------------------------------------------------ pass tables
    def _ops(self) -> pl.DataFrame:
        return schemas.conform(pl.DataFrame(self.ops).with_columns(
            pl.lit("t").alias("trace_id")), schemas.GPU_OPS)

    def _overlap(self, ops: pl.DataFrame, steps: pl.DataFrame | None) -> pl.DataFrame:
        o = ops.with_columns(pl.col("op_class").replace_strict(OVERLAP_CLASS_OF_OP_CLASS)
                             .alias("cls"))
        seg = intervals.state_segments(o, CLASSES, by=["device_id"]).collect()
        whole = (seg.group_by(["device_id", "state"])
                 .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("duration_ns"))
                 .with_columns(pl.lit(None, pl.Int64).alias("step")))
        parts = [whole]
        if steps is not None:
            for dev in seg["device_id"].unique().to_list():  # tests only: few devices
                pieces = intervals.overlay(seg.filter(pl.col("device_id") == dev),
                                           steps.select(["step", "start_ns", "end_ns"]),
                                           window_cols=["step"]).collect()
                parts.append(pieces.group_by(["step", "state"]).agg(
                    (pl.col("end_ns") - pl.col("start_ns")).sum().alias("duration_ns"))
                    .with_columns(pl.lit(dev, pl.Int64).alias("device_id")))
        return schemas.conform(pl.concat(parts, how="diagonal_relaxed")
                               .with_columns(pl.lit("t").alias("trace_id")), schemas.OVERLAP)

    def _gaps(self, ops: pl.DataFrame) -> pl.DataFrame:
        g = (intervals.complement(ops.select(["device_id", "start_ns", "end_ns"]),
                                  by=["device_id"]).collect()
             .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
             .filter(pl.col("duration_ns") >= MS))
        cause = pl.lit("no_cuda_activity")
        detail = pl.lit(None, pl.String)
        for s, e, c, d in self.causes:
            hit = (pl.col("start_ns") >= s) & (pl.col("start_ns") < e)
            cause = pl.when(hit).then(pl.lit(c)).otherwise(cause)
            detail = pl.when(hit).then(pl.lit(d)).otherwise(detail)
        g = g.with_columns(cause.alias("cause"), detail.alias("cause_detail"),
                           pl.lit(1.0).alias("cause_frac"), pl.lit("device").alias("scope"),
                           pl.lit("t").alias("trace_id"))
        return schemas.conform(g, schemas.GAPS)

    def _kernels(self, ops: pl.DataFrame) -> pl.DataFrame:
        k = ops.filter(pl.col("kind") == "kernel").with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).alias("d"))
        total = k["d"].sum() or 1
        agg = (k.group_by(["name", "op_class"]).agg(
            pl.len().alias("count"), pl.col("d").sum().alias("total_ns"),
            pl.col("d").mean().alias("mean_ns"))
            .with_columns(pl.col("name").alias("demangled_name"),
                          pl.col("name").alias("short_name"),
                          (pl.col("total_ns") / total).alias("gpu_time_frac"),
                          pl.col("name").replace_strict(self.tensor_core, default=None,
                                                        return_dtype=pl.Boolean)
                          .alias("tensor_core"),
                          pl.lit("test").alias("tensor_core_rule"),
                          pl.lit("t").alias("trace_id")))
        return schemas.conform(agg, schemas.KERNELS)

    def build(self, steps: list[tuple[int, int]] | None = None,
              frames: Mapping[str, pl.DataFrame] | None = None,
              skip: tuple[str, ...] = (), extra: Mapping[str, pl.DataFrame] | None = None,
              **meta) -> tuple[Trace, dict[str, PassResult]]:
        ops = self._ops()
        fr: dict[str, pl.DataFrame] = {"gpu_ops": ops}
        if self.apis:
            fr["cuda_api"] = pl.DataFrame(self.apis)
        if self.nvtx:
            fr["nvtx"] = pl.DataFrame(self.nvtx)
        fr.update(frames or {})
        fr = {k: v for k, v in fr.items() if k not in skip}
        trace = Trace.from_frames("t", fr, **meta)
        st = None
        if steps:
            st = schemas.conform(pl.DataFrame(
                {"step": list(range(len(steps))), "start_ns": [s for s, _ in steps],
                 "end_ns": [e for _, e in steps]})
                .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
                              pl.lit("nvtx:step").alias("source"),
                              pl.lit(False).alias("warmup"), pl.lit("t").alias("trace_id")),
                schemas.STEPS)
        results = {
            "steps": PassResult(tables={"steps": st if st is not None
                                        else schemas.empty(schemas.STEPS)}),
            "gaps": PassResult(tables={"gaps": self._gaps(ops)}),
            "overlap": PassResult(tables={"overlap": self._overlap(ops, st)}),
            "kernels": PassResult(tables={"kernels": self._kernels(ops)}),
        }
        if self.layers is not None:
            results["attribution"] = PassResult(tables={
                "layers": schemas.conform(self.layers.with_columns(pl.lit("t").alias("trace_id")),
                                          schemas.LAYERS),
                "attribution": schemas.empty(schemas.ATTRIBUTION)})
        for name, df in (extra or {}).items():
            results[f"extra_{name}"] = PassResult(tables={name: df})
        return trace, {k: v for k, v in results.items() if k not in skip}


# ---------------------------------------------------------------------------------------------
# Scenarios: sixteen 10 ms steps starting at 1 ms; each plants one symptom.
# ---------------------------------------------------------------------------------------------
STEP = 10 * MS
N_STEPS = 16


def _steps() -> list[tuple[int, int]]:
    return [(MS + i * STEP, MS + (i + 1) * STEP) for i in range(N_STEPS)]


def _dense(c: Case, t0: int, t1: int, dur: int = 500 * US, name: str = "ampere_sgemm_128x64_nn"
           ) -> None:
    """Back-to-back compute kernels, launched well ahead (a healthy queue)."""
    t = t0
    while t + dur <= t1:
        c.kernel(t, dur, name)
        t += dur


def healthy() -> Case:
    c = Case()
    for s, e in _steps():
        _dense(c, s, e)
        c.kernel(s + 6 * MS, 2 * MS, "ncclKernel_AllReduce_RING_LL_Sum_float", "nccl",
                 stream=11)  # hidden behind compute
        c.copy(s + MS, 300 * US)  # pinned async H2D, overlapped
        c.range("forward", s, s + 7 * MS)
    return c


def starved_input() -> Case:
    c = Case()
    for s, e in _steps():
        _dense(c, s, e - 4 * MS)
        c.cause(e - 4 * MS, e, "nvtx_range", "DataLoader.__next__ (nvtx) 3.9 ms")
        c.range("DataLoader.__next__", e - 4 * MS, e)
    return c


def exposed_allreduce() -> Case:
    c = Case()
    for s, e in _steps():
        _dense(c, s, e - 4 * MS)
        c.kernel(e - 4 * MS, 4 * MS, "ncclKernel_AllReduce_RING_LL_Sum_float", "nccl",
                 stream=11)
    return c


def launch_bound() -> Case:
    c = Case()
    for s, e in _steps():
        t = s
        while t + 5 * US <= e:
            # the launch call starts 2 µs before the kernel: the host is the bottleneck
            c.kernel(t + 20 * US, 5 * US, "vectorized_elementwise_kernel", launch=t + 18 * US,
                     api_dur=3 * US)
            t += 25 * US
    return c


def pageable_copies() -> Case:
    c = Case()
    for s, e in _steps():
        # pageable H2D upload: the host is blocked for the whole copy, nothing overlaps it
        c.copy(s, 3 * MS, src="pageable", api_start=s - 20 * US, api_end=s + 3 * MS + 10 * US)
        _dense(c, s + 3 * MS + 30 * US, e)
    return c


def sync_in_loop() -> Case:
    c = Case()
    for s, e in _steps():
        _dense(c, s, e - 800 * US)
        # the host waits for the GPU to drain, then needs 700 µs to launch again
        c.api("cudaDeviceSynchronize", "sync", e - 3 * MS, e - 800 * US + 5 * US)
    return c


def unoverlapped_h2d() -> Case:
    c = Case()
    for s, e in _steps():
        c.copy(s, 2 * MS)  # pinned, async, but on the compute stream before compute
        _dense(c, s + 2 * MS, e)
    return c


def memory_churn() -> Case:
    c = healthy()
    for s, _ in _steps():
        c.api("cudaMalloc", "malloc", s + 2 * MS, s + 2 * MS + 400 * US)
        c.api("cudaFree", "malloc", s + 5 * MS, s + 5 * MS + 400 * US)
    return c


SCENARIOS: dict[str, tuple[Callable[[], Case], set[str]]] = {
    "healthy": (healthy, set()),
    "starved_input": (starved_input, {"GPU_STARVATION_PERIODIC"}),
    "exposed_allreduce": (exposed_allreduce, {"EXPOSED_COMMUNICATION"}),
    "launch_bound": (launch_bound, {"LAUNCH_BOUND"}),
    "pageable_copies": (pageable_copies, {"PAGEABLE_OR_SYNC_COPIES"}),
    "sync_in_loop": (sync_in_loop, {"HOST_SYNC_IN_STEP"}),
    "unoverlapped_h2d": (unoverlapped_h2d, {"H2D_NOT_OVERLAPPED"}),
    "memory_churn": (memory_churn, {"MEMORY_CHURN"}),
}


def scenario(name: str, with_steps: bool = True) -> tuple[Trace, dict[str, PassResult]]:
    make, _ = SCENARIOS[name]
    return make().build(_steps() if with_steps else None)
