"""nccl: one row per NCCL collective / point-to-point operation, with its exposed time.

What makes an operation: every NCCL kernel (``op_class == "nccl"``) is one operation, since
NCCL launches one kernel per collective, or per group of operations fused by
``ncclGroupStart/End`` (a grouped send + receive is one ``SendRecv`` kernel).

- **op**: from NCCL's own NVTX API ranges (``ncclAllReduce``, ``ncclSend``, ...) that issued
  the kernel when the export has them, else from the kernel name. NCCL maintainers warn that
  the kernel name does not reliably say which operation ran (NCCL 2.13 named everything
  SendRecv; ``ncclDevKernel_Generic_*``), so the API ranges win. An API range issued a kernel
  when it starts on the launching thread after that thread's previous NCCL launch and before
  this launch ends (the launch usually happens inside ``ncclGroupEnd``, after the op's range).
  Both naming schemes are parsed: ``ncclKernel_AllReduce_RING_LL_Sum_float`` (NCCL < 2.19)
  and ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` / ``ncclDevKernel_SendRecv(...)`` (2.19+),
  and the 2.4-era ``ncclAllReduceRingLLKernel_sum_f32``.
- **bytes**: NCCL's NVTX payload field ``Message size [bytes]`` (``payload_json`` of the nvtx
  frame; exports before nsys 2024 drop the payloads, so bytes are then null). For a group the
  sizes are summed (a SendRecv group counts the bytes it sends).
- **algbw / busbw** follow nccl-tests: ``algbw = S / t`` with S the nccl-tests size (NCCL's
  message size, times n for AllGather / ReduceScatter whose NVTX size is per rank), and
  ``busbw = algbw x factor``: AllReduce 2(n-1)/n, AllGather / ReduceScatter / AllToAll (n-1)/n,
  every other op 1. n (ranks) comes from ``params.n_ranks``, else the ``No. of ranks`` of
  NCCL's communicator-init payload, else the job's world size in the capture environment, else
  the number of processes running NCCL kernels when there are several.
- **exposed_ns**: the op's time not covered by the union of compute ops on its device (the
  overlap pass's devices: ``device_id``). Summed over ops it equals the overlap pass's
  ``exposed_nccl_ns`` (nccl active, compute not) whenever NCCL kernels of a device never run
  concurrently with each other; ``metrics["exposed_nccl_ns"]`` is the union form, equal to it
  in every case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from nsysan.errors import ConfigError
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.text import per_value
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks, op_link
from nsysan.passes.base import Finding, PassResult, PassSpec, Results

# The name parsing and bandwidth formulas are part of this pass's interface: re-exported.
from nsysan.passes.nccl_names import _busbw_factor_expr as _busbw_factor_expr
from nsysan.passes.nccl_names import algbw_expr as algbw_expr
from nsysan.passes.nccl_names import api_op, parse_kernel_names, with_bandwidth
from nsysan.passes.nccl_names import busbw_factor as busbw_factor
from nsysan.passes.nccl_names import kernel_fields as kernel_fields

#: NCCL payload fields (``payload_json`` of the nvtx frame) and communicator-init ranges
_COMM_INIT_RE = r"^ncclComm(?:InitRank|InitAll|InitRankConfig|InitRankScalable|Split)"
_MSG_SIZE_RE = r'"Message size \[bytes\]"\s*:\s*"?(\d+)'
_N_RANKS_RE = r'"No\. of ranks"\s*:\s*"?(\d+)'
_COMM_ID_RE = r'"NCCL communicator ID"\s*:\s*"?(-?\d+)'


# ---------------------------------------------------------------------------------------------
# Params
# ---------------------------------------------------------------------------------------------
#: nominal per-direction NVLink bandwidth (GB/s) by GPU name: an upper bound for busbw on one
#: node. Checked in order; "PCIE" boards get PCIe 4 x16.
NOMINAL_LINK_GBPS = (
    ("PCIE", 25.0), ("B200", 900.0), ("B100", 900.0), ("GB200", 900.0), ("H800", 200.0),
    ("H100", 450.0), ("H200", 450.0), ("A800", 200.0), ("A100", 300.0), ("V100", 150.0),
)


@dataclass(frozen=True)
class NcclParams:
    n_ranks: int | None = None  # ranks per communicator, when the profile does not say
    size_buckets: tuple[int, ...] = (65536, 1 << 20, 16 << 20, 256 << 20)  # bytes
    exposed_warn_frac: float = 0.10  # exposed NCCL / device span: warning
    exposed_critical_frac: float = 0.25
    min_bw_bytes: int = 1 << 20  # only ops at least this large judge bandwidth
    low_busbw_gbps: float = 10.0  # median busbw below: warning (below 2 GB/s: critical)
    link_gbps: float | None = None  # peak busbw of the links; None = nominal from GPU name
    low_link_frac: float = 0.25  # median busbw below this share of the link: warning

    def __post_init__(self) -> None:
        if self.n_ranks is not None and self.n_ranks < 1:
            raise ConfigError(f"nccl.n_ranks must be >= 1, got {self.n_ranks}")
        if list(self.size_buckets) != sorted(set(self.size_buckets)) or any(
            b <= 0 for b in self.size_buckets
        ):
            raise ConfigError("nccl.size_buckets must be positive and strictly increasing")
        if not 0 < self.exposed_warn_frac <= self.exposed_critical_frac <= 1:
            raise ConfigError("nccl: need 0 < exposed_warn_frac <= exposed_critical_frac <= 1")
        if self.link_gbps is not None and self.link_gbps <= 0:
            raise ConfigError(f"nccl.link_gbps must be positive, got {self.link_gbps}")


# ---------------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------------
def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def _bucket_exprs(edges: tuple[int, ...]) -> tuple[pl.Expr, pl.Expr]:
    """``size_bucket`` label and ``bucket_min_bytes`` of the ``bytes`` column."""
    b = pl.col("bytes")
    label: pl.Expr = pl.lit(f">={_fmt_bytes(edges[-1])}")
    low: pl.Expr = pl.lit(edges[-1], pl.Int64)
    bounds = [0, *edges]
    for i in range(len(edges) - 1, -1, -1):
        lo, hi = bounds[i], bounds[i + 1]
        text = f"<{_fmt_bytes(hi)}" if i == 0 else f"{_fmt_bytes(lo)}-{_fmt_bytes(hi)}"
        label = pl.when(b < hi).then(pl.lit(text)).otherwise(label)
        low = pl.when(b < hi).then(pl.lit(lo, pl.Int64)).otherwise(low)
    missing = b.is_null()
    return (
        pl.when(missing).then(pl.lit("unknown")).otherwise(label).alias("size_bucket"),
        pl.when(missing).then(None).otherwise(low).alias("bucket_min_bytes"),
    )


def _world_size(trace: Trace) -> int | None:
    from nsysan.load.environment import env_of_trace, world_size_from_env

    return world_size_from_env(env_of_trace(trace))


def _issued_by(trace: Trace, launches: pl.LazyFrame) -> pl.LazyFrame:
    """Per launch ``(global_pid, correlation_id)``: the NCCL API ranges that issued it."""
    nvtx = trace.frame("nvtx")
    out_schema = {"global_pid": pl.Int64, "correlation_id": pl.Int64, "nvtx_range": pl.String,
                  "nvtx_op": pl.String, "bytes": pl.Int64, "comm_id": pl.String}
    if nvtx.is_empty():
        return pl.LazyFrame(schema=out_schema)
    ranges = (
        nvtx.lazy()
        # NCCL's API ranges all start with "nccl": a prefix test (once per distinct name)
        # spares the regex most rows; the few left are named as text.
        .filter((pl.col("style") != "mark")
                & per_value(nvtx, "name", pl.col("name").str.starts_with("nccl")))
        .with_columns(pl.col("name").cast(pl.String))
        .with_columns(api_op().alias("_op"))
        .filter(pl.col("_op").is_not_null())
        .select(
            "global_tid", "start_ns", "name", "_op",
            pl.col("payload_json").str.extract(_MSG_SIZE_RE, 1).cast(pl.Int64).alias("_bytes"),
            pl.col("payload_json").str.extract(_COMM_ID_RE, 1).alias("_comm"),
        )
        .sort("start_ns", maintain_order=True)  # stable: ties keep the nvtx frame's order
    )
    # Each range goes to the first NCCL launch on its thread that ends at or after its start.
    linked = (
        ranges.join_asof(
            launches.select("global_tid", "global_pid", "correlation_id", "api_end_ns")
            .sort("api_end_ns", "global_pid", "correlation_id"),
            left_on="start_ns", right_on="api_end_ns", by="global_tid", strategy="forward",
            check_sortedness=False,
        )
        .filter(pl.col("correlation_id").is_not_null())
        .collect()  # read three times below
        .lazy()
    )
    # The distinct sorted names and ops of each launch: made distinct and sorted once over
    # all launches, not a list sorted per launch (tens of thousands of tiny groups).
    key = ["global_pid", "correlation_id"]

    def sorted_distinct(col: str) -> pl.LazyFrame:
        return (linked.select(*key, col).unique().sort(*key, col)
                .group_by(key, maintain_order=True))

    per_launch = (
        linked.group_by(key)
        .agg(
            pl.col("_bytes").filter(pl.col("_op") == "Send").sum().alias("_send_bytes"),
            pl.col("_bytes").sum().alias("_all_bytes"),
            pl.col("_bytes").is_not_null().any().alias("_has_bytes"),
            pl.col("_comm").drop_nulls().first().alias("comm_id"),
        )
        .join(sorted_distinct("name").agg(pl.col("name").str.join("+").alias("nvtx_range")),
              on=key, nulls_equal=True)
        .join(sorted_distinct("_op").agg(pl.col("_op").alias("_ops")), on=key,
              nulls_equal=True)
    )
    ops = pl.col("_ops")
    p2p_only = ops.list.set_difference(pl.lit(["Send", "Recv"])).list.len() == 0
    nvtx_op = (
        pl.when(ops.list.len() == 1).then(ops.list.first())
        .when(p2p_only).then(pl.lit("SendRecv"))
    )
    nbytes = pl.when(~pl.col("_has_bytes")).then(None).when(
        p2p_only & ops.list.contains("Send")
    ).then(pl.col("_send_bytes")).otherwise(pl.col("_all_bytes"))
    return per_launch.select(
        "global_pid", "correlation_id", "nvtx_range", nvtx_op.alias("nvtx_op"),
        nbytes.cast(pl.Int64).alias("bytes"), "comm_id",
    )


def _n_ranks(trace: Trace, params: NcclParams, kernels: pl.DataFrame) -> pl.DataFrame:
    """``pid, n_ranks`` for every process with NCCL kernels."""
    pids = kernels.select("pid").unique()
    if params.n_ranks is not None:
        return pids.with_columns(pl.lit(params.n_ranks, pl.Int64).alias("n_ranks"))
    nvtx = trace.frame("nvtx")
    # The regex is anchored on "ncclComm": an eager prefix test first spares it every other
    # name (a lazy plan would fuse both tests into one predicate over every row).
    # (filtered inside the select: a frame's filter expands its constant columns, here the
    # usually empty payload, to every row first, `nsysan.frames.trace`)
    is_comm = per_value(nvtx, "name", pl.col("name").str.starts_with("ncclComm")).fill_null(False)
    from_payload = (
        nvtx.select(pl.col("pid", "name", "payload_json").filter(is_comm))
        .with_columns(pl.col("name").cast(pl.String))
        .lazy()
        .filter(pl.col("name").str.contains(_COMM_INIT_RE).fill_null(False))
        .select("pid", pl.col("payload_json").str.extract(_N_RANKS_RE, 1).cast(pl.Int64)
                .alias("_n"))
        .group_by("pid")
        .agg(pl.col("_n").max())
        .collect()
    )
    fallback = _world_size(trace)
    if fallback is None and pids.height > 1:
        fallback = pids.height
    return pids.join(from_payload, on="pid", how="left").select(
        "pid", pl.coalesce("_n", pl.lit(fallback, pl.Int64)).alias("n_ranks")
    )


def nccl_ops(trace: Trace, params: NcclParams, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """The NCCL table of ``trace`` (schema `schemas.NCCL`)."""
    return _nccl_table(trace, params, steps)[0]


def _exposure(trace: Trace, kern: pl.DataFrame) -> tuple[pl.Series, int]:
    """(compute-covered ns of each ``kern`` row, exposed ns of the union of ``kern`` per device).

    Both measure against the union of the device's timed compute ops, the costly part (a sort
    of every compute kernel), which `device_blocks` shares with the other passes and the
    findings; the coverage is then a binary search per op bound.
    """
    spans = kern.select("device_id", "start_ns", "end_ns")
    compute = device_blocks.union(trace, ["compute"], timed=True)
    mine = iv.union(spans, ["device_id"]).collect()
    # One coverage pass over both (one walk over each device's compute blocks, not two).
    both = device_blocks.covered(compute, pl.concat([spans, mine]))
    exposed = int((mine["end_ns"] - mine["start_ns"]).sum() - both.slice(spans.height).sum())
    return both.head(spans.height), exposed


def _launches(trace: Trace, kern: pl.DataFrame) -> pl.LazyFrame:
    """One row per launch (``global_pid, correlation_id``) of the ``kern`` rows, with its API
    call: ``global_tid, api_name, api_start_ns, api_end_ns``."""
    api = trace.frame("cuda_api")
    # every op's call is known (`op_link.api_rows`): a gather
    k = kern.filter(pl.col("_api_row") >= 0).unique(
        ["global_pid", "correlation_id"], keep="first", maintain_order=True)
    return k.select(
        "global_pid", "correlation_id",
        *(op_link.gather(api[col], k["_api_row"]).alias(alias) for col, alias in (
            ("global_tid", "global_tid"), ("name", "api_name"),
            ("start_ns", "api_start_ns"), ("end_ns", "api_end_ns"))),
    ).lazy()



def _nccl_table(
    trace: Trace, params: NcclParams, steps: pl.DataFrame | None
) -> tuple[pl.DataFrame, int]:
    """`nccl_ops` and the exposed time of the union of its ops (``exposed_nccl_ns``)."""
    # start 0 is CUPTI's "timestamp unknown" (the overlap and gaps passes drop it too)
    gpu = trace.frame("gpu_ops").select(
        "pid", "global_pid", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns",
        pl.col("name").alias("kernel_name"), "op_class",
    )
    gpu = gpu.with_columns(pl.Series("_api_row", op_link.api_rows(trace)))
    # (inside a select: a frame's filter would expand ``global_pid``, constant in a profile
    # of one process, to every op first, `nsysan.frames.trace`)
    kern = gpu.select(pl.all().filter(
        (pl.col("start_ns") > 0) & (pl.col("op_class") == "nccl")
        & (pl.col("end_ns") >= pl.col("start_ns"))
    )).drop("op_class")
    if kern.is_empty():
        return schemas.empty(schemas.NCCL), 0
    # each distinct kernel name parsed once, as text; joined back by the Categorical name
    distinct = kern["kernel_name"].unique()
    names = parse_kernel_names(distinct.cast(pl.String)).rename(
        {"name": "kernel_name", "op": "kernel_op"}
    ).with_columns(pl.col("kernel_name").cast(distinct.dtype))
    launches = _launches(trace, kern)
    kern = kern.drop("_api_row")
    issued = _issued_by(trace, launches)
    covered, union_exposed = _exposure(trace, kern)
    n_ranks = _n_ranks(trace, params, kern)
    dur = pl.col("end_ns") - pl.col("start_ns")
    op = pl.coalesce("nvtx_op", "kernel_op", pl.lit("Generic"))
    table = (
        kern.lazy()
        .with_columns(covered)
        .with_row_index("_k")  # gpu_ops (content) order: breaks the sort's ties below
        .join(names.lazy(), on="kernel_name", how="left")
        .join(launches.drop("global_tid", "api_end_ns"), on=["global_pid", "correlation_id"],
              how="left")
        .join(issued, on=["global_pid", "correlation_id"], how="left")
        .join(n_ranks.lazy(), on="pid", how="left")
        .sort("pid", "device_id", "stream_id", "start_ns", "end_ns", "_k")
        .with_columns(
            pl.lit(trace.trace_id).alias("trace_id"),
            op.alias("op"),
            pl.when(pl.col("nvtx_op").is_not_null()).then(pl.lit("nvtx"))
            .otherwise(pl.lit("kernel")).alias("op_source"),
            dur.alias("duration_ns"),
            (dur - pl.col("covered_ns")).alias("exposed_ns"),
            pl.int_range(pl.len(), dtype=pl.Int64).over("pid", "device_id", "stream_id")
            .alias("seq"),
        )
        .pipe(with_bandwidth)
        .collect()
    )
    if steps is not None and not steps.is_empty():
        win = steps.select("step", pl.col("start_ns").alias("_ss"), pl.col("end_ns").alias("_se"))
        table = (
            table.sort("start_ns")
            .join_asof(win.sort("_ss"), left_on="start_ns", right_on="_ss", strategy="backward")
            .with_columns(
                pl.when(pl.col("start_ns") < pl.col("_se")).then(pl.col("step")).alias("step")
            )
            .sort("pid", "device_id", "stream_id", "start_ns", "end_ns", "_k")
        )
    return schemas.conform(table, schemas.NCCL), union_exposed


def summarize(table: pl.DataFrame, params: NcclParams, trace_id: str) -> pl.DataFrame:
    """Per op and message-size bucket (schema `schemas.NCCL_SUMMARY`)."""
    if table.is_empty():
        return schemas.empty(schemas.NCCL_SUMMARY)
    label, low = _bucket_exprs(params.size_buckets)
    dur = pl.col("duration_ns")
    out = (
        table.lazy()
        .with_columns(label, low)
        .group_by("op", "size_bucket", "bucket_min_bytes")
        .agg(
            pl.len().cast(pl.Int64).alias("n_ops"),
            dur.sum().alias("total_ns"),
            dur.mean().alias("mean_ns"),
            dur.median().alias("median_ns"),
            dur.max().alias("max_ns"),
            pl.col("exposed_ns").sum(),
            pl.col("bytes").sum().alias("total_bytes"),
            pl.col("bytes").is_not_null().any().alias("_known"),
            pl.col("algbw_gbps").median(),
            pl.col("busbw_gbps").median(),
        )
        .with_columns(
            pl.lit(trace_id).alias("trace_id"),
            pl.when(pl.col("total_ns") > 0)
            .then(pl.col("exposed_ns") / pl.col("total_ns")).alias("exposed_frac"),
            pl.when(pl.col("_known")).then(pl.col("total_bytes")).alias("total_bytes"),
        )
        .sort("op", pl.col("bucket_min_bytes").fill_null(-1))
        .collect()
    )
    return schemas.conform(out, schemas.NCCL_SUMMARY)


def nominal_link_gbps(gpu_names: list[str]) -> float | None:
    """Nominal per-direction link bandwidth of the slowest listed GPU (None if unknown)."""
    found = []
    for name in gpu_names:
        upper = (name or "").upper()
        for key, gbps in NOMINAL_LINK_GBPS:
            if key in upper:
                found.append(gbps)
                break
    return min(found) if found else None


def with_default_ranks(table: pl.DataFrame, n_ranks: int | None) -> pl.DataFrame:
    """Fill unknown ``n_ranks`` with ``n_ranks`` (e.g. a job's rank count) and recompute the
    bandwidths."""
    if n_ranks is None or table.is_empty() or table["n_ranks"].null_count() == 0:
        return table
    return with_bandwidth(table.with_columns(pl.col("n_ranks").fill_null(n_ranks)))


def nccl_findings(trace: Trace, table: pl.DataFrame, params: NcclParams,
                  metrics: dict[str, Any] | None = None) -> list[Finding]:
    """EXPOSED_COMMUNICATION per device and NCCL_LOW_BANDWIDTH (see `NcclParams`)."""
    out: list[Finding] = []
    metrics = metrics or {}
    if table.is_empty():
        return out
    # Lazy: an eager group-by of the op frame runs unoptimised, several times slower.
    spans = (
        trace.frame("gpu_ops").lazy()
        .group_by("device_id")
        .agg((pl.col("end_ns").max() - pl.col("start_ns").min()).alias("span_ns"))
    )
    per_dev = (
        table.lazy().group_by("device_id")
        .agg(pl.col("exposed_ns").sum(), pl.col("duration_ns").sum().alias("nccl_ns"),
             pl.len().alias("n_ops"))
        .join(spans, on="device_id", how="left")
        .sort("device_id")
        .collect()
    )
    for row in per_dev.iter_rows(named=True):  # one row per device, not per event
        span = row["span_ns"] or 0
        frac = row["exposed_ns"] / span if span > 0 else 0.0
        if frac < params.exposed_warn_frac:
            continue
        sev = "critical" if frac >= params.exposed_critical_frac else "warning"
        hidden = 1 - row["exposed_ns"] / row["nccl_ns"] if row["nccl_ns"] else 0.0
        out.append(Finding(
            code="EXPOSED_COMMUNICATION", severity=sev, layer="communication",
            title="Exposed communication (NCCL not overlapped with compute)",
            message=(
                f"Device {row['device_id']}: {row['n_ops']} NCCL operations leave "
                f"{row['exposed_ns'] / 1e6:.1f} ms exposed (no compute beside them), "
                f"{frac:.0%} of the device's {span / 1e6:.1f} ms span; only {hidden:.0%} of "
                "NCCL time is hidden behind compute."
            ),
            evidence={"exposed_ns": row["exposed_ns"], "span_ns": span, "exposed_frac": frac,
                      "nccl_ns": row["nccl_ns"], "hidden_frac": hidden,
                      "exposed_per_step_ns": metrics.get("exposed_per_step_ns")},
            device_id=row["device_id"],
        ))
    return out + low_bandwidth_findings(table, params,
                                        lambda: trace.frame("gpus")["name"].to_list())


def low_bandwidth_findings(table: pl.DataFrame, params: NcclParams,
                           gpu_names: Callable[[], list[str]]) -> list[Finding]:
    """NCCL_LOW_BANDWIDTH from the NCCL table of one profile and its GPUs' names, asked for
    only when needed (the nominal link of `nominal_link_gbps` unless ``nccl.link_gbps``
    is set)."""
    sized = table.filter(
        pl.col("busbw_gbps").is_not_null() & (pl.col("bytes") >= params.min_bw_bytes)
    ) if not table.is_empty() else table
    out: list[Finding] = []
    if not sized.is_empty():
        median = float(sized["busbw_gbps"].median())  # type: ignore[arg-type]
        link = params.link_gbps or nominal_link_gbps(gpu_names())
        low_abs = median < params.low_busbw_gbps
        low_rel = link is not None and median < params.low_link_frac * link
        if low_abs or low_rel:
            sev = "critical" if median < 2.0 else "warning"
            vs = f" against a nominal {link:.0f} GB/s link" if link else ""
            out.append(Finding(
                code="NCCL_LOW_BANDWIDTH", severity=sev, layer="communication",
                title="Low NCCL bus bandwidth",
                message=(
                    f"Median bus bandwidth of {sized.height} NCCL operations of at least "
                    f"{_fmt_bytes(params.min_bw_bytes)} is {median:.1f} GB/s{vs}. Durations "
                    "include waiting for late ranks; if ranks span nodes compare with the "
                    "network bandwidth instead (set nccl.link_gbps)."
                ),
                evidence={"median_busbw_gbps": median, "n_ops": sized.height,
                          "link_gbps": link, "min_bytes": params.min_bw_bytes},
            ))
    return out


def run(trace: Trace, params: NcclParams, results: Results) -> PassResult:
    steps_res = results.get("steps")
    steps = steps_res.tables.get("steps") if steps_res is not None else None
    table, union_exposed = _nccl_table(trace, params, steps)
    summary = summarize(table, params, trace.trace_id)
    metrics: dict[str, Any] = {"n_ops": table.height}
    if not table.is_empty():
        metrics.update(
            nccl_ns=int(table["duration_ns"].sum()),
            exposed_sum_ns=int(table["exposed_ns"].sum()),
            exposed_nccl_ns=union_exposed,
            ops=dict(table.group_by("op").len().sort("op").iter_rows()),
            op_sources=dict(table.group_by("op_source").len().sort("op_source").iter_rows()),
            bytes_known=bool(table["bytes"].is_not_null().any()),
        )
        per_step = table.filter(pl.col("step").is_not_null())
        if not per_step.is_empty():
            metrics["exposed_per_step_ns"] = float(
                per_step.group_by("step").agg(pl.col("exposed_ns").sum())["exposed_ns"].median()
            )  # type: ignore[arg-type]
    findings = nccl_findings(trace, table, params, metrics)
    return PassResult(
        tables={"nccl": table, "nccl_summary": summary}, findings=findings, metrics=metrics
    )


SPEC = PassSpec(
    name="nccl",
    description="NCCL collectives and point-to-point ops: op, size, bandwidth, exposed time",
    params=NcclParams,
    tables={"nccl": schemas.NCCL, "nccl_summary": schemas.NCCL_SUMMARY},
    run=run,
    default=True,
    after=("steps",),
)
