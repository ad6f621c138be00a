"""What ``nsysan scaling`` measures in one job at one scale (`measure_run`).

A run is one job: its rank profiles, read with `nsysan.multirank.job.analyze_job` (ranks,
clock alignment, collectives, NCCL ops, per-rank steps). Per rank and steady step (the steps
pass's GPU windows, local time of the rank's profile, on the rank's device):

- **engine states**, an exact partition of the step window: ``compute`` (a compute kernel
  runs), ``communication`` (NCCL runs, no compute: exposed communication), ``copies`` (only
  copies / memsets), ``idle`` (nothing). Measured as nested unions: |C|, |C u N| - |C|,
  |C u N u M| - |C u N|, window - |C u N u M|.
- **layers**: each NVTX layer's exclusive GPU time (the attribution pass on the rank's
  process, range instances assigned to the step their GPU projection starts in),
  ``(outside NVTX ranges)`` = busy time not owned by a layer (the remainder; it can be
  negative when ops of one layer overlap, e.g. NCCL beside compute), and ``GPU idle``. They
  sum exactly to the window.
- **end-of-step gap**: from the end of the step's last compute kernel (the latest end of the
  compute kernels that start in the window) to the window's end: the time in which the GPU runs
  only communication (``end_gap_comm_ns``) or nothing. Null in a step without compute.

Only the steps every rank has (by step number) take part, so that every item is averaged over
the same (rank, step) pairs and the items' means sum exactly to the mean step time.

Per collective op: the **transfer time** of each matched instance is its first end minus its
last arrival (job timeline): the time the collective took once every rank was there, so it
excludes waiting for late ranks; bus bandwidth (nccl-tests formulas, `nccl_names`) uses it.
Per message sizes: NCCL's NVTX payload (`nsysan.load.adapters_nvtx_payload`); absent, sizes
and bandwidth are unknown and said so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from nsysan.compare.decompose import OUTSIDE, layer_per_step
from nsysan.errors import ConfigError
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.multirank.job import JobParams, JobResult, analyze_job
from nsysan.passes import device_blocks
from nsysan.passes.nccl_names import with_bandwidth
from nsysan.report.ownership import MARKER

GPU_IDLE = "GPU idle"
STATES = ("compute", "communication", "copies", "idle")
COPY_CLASSES = ("memcpy_h2d", "memcpy_d2h", "memcpy_d2d", "memcpy_p2p", "memset")

STEP_ROWS = pl.Schema({
    "run": pl.String, "rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64,
    "end_ns": pl.Int64, "duration_ns": pl.Int64, "compute_ns": pl.Int64,
    "communication_ns": pl.Int64, "copies_ns": pl.Int64, "idle_ns": pl.Int64,
    "last_compute_end_ns": pl.Int64, "end_gap_ns": pl.Int64, "end_gap_comm_ns": pl.Int64,
})


@dataclass
class ScaleRun:
    """One job at one scale, measured."""

    run: str  # label (as given)
    source: str
    n_gpus: int
    n_ranks: int
    n_nodes: int | None  # distinct hostnames (None: unknown)
    steps: pl.DataFrame  # STEP_ROWS: per rank and common steady step
    layers: pl.DataFrame  # run, rank, step, item, kind, ns
    collectives: pl.DataFrame  # per op: see `_collectives`
    ranks: pl.DataFrame  # per rank: see `_ranks`
    kernel_mix: dict[str, float]
    launch_mix: dict[str, float]
    gpu_names: list[str]
    job: JobResult
    notes: list[str] = field(default_factory=list)
    #: host-evidence findings (warning or worse) of the rank profiles that carry CPU sampling
    #: or scheduling data, as ``"CODE (trace_id)"``, sorted; empty when none carry any
    host_findings: list[str] = field(default_factory=list)
    #: whether any rank profile carries host evidence at all (sampling or scheduling)
    host_captured: bool = False

    @property
    def step_numbers(self) -> list[int]:
        return sorted(self.steps["step"].unique().to_list())

    def step_samples(self) -> pl.DataFrame:
        """``step, duration_ns``: the mean over ranks of each common step (the per-step
        samples of the efficiency interval)."""
        return (self.steps.group_by("step").agg(pl.col("duration_ns").mean())
                .sort("step"))


def _rank_keys(job: JobResult) -> pl.DataFrame:
    index = {t.trace_id: i for i, t in enumerate(job.traces)}
    return job.ranks.select(
        "rank", "pid", "device_id", "hostname",
        pl.col("source_trace_id").replace_strict(index, return_dtype=pl.Int64)
        .alias("trace_index"))


def _steady(job: JobResult, keys: pl.DataFrame, notes: list[str]) -> pl.DataFrame:
    """``rank, step, start_ns, end_ns, duration_ns`` of the steady steps every rank has."""
    if job.steps.is_empty():
        return pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "start_ns": pl.Int64,
                                    "end_ns": pl.Int64, "duration_ns": pl.Int64})
    st = job.steps.select(pl.col("rank", "step", "start_ns", "end_ns", "duration_ns")
                          .cast(pl.Int64), "warmup")
    steady = st.filter(~pl.col("warmup").fill_null(False))
    steady = (steady if not steady.is_empty() else st).drop("warmup")
    n = keys.height
    common = (steady.group_by("step").agg(pl.col("rank").n_unique().alias("_n"))
              .filter(pl.col("_n") == n).select("step"))
    dropped = steady.select("step").unique().height - common.height
    if dropped:
        notes.append(f"{dropped} steady steps are missing on some rank and were left out")
    return steady.join(common, on="step").sort("rank", "step")


def _rank_ops(job: JobResult, keys: pl.DataFrame) -> pl.DataFrame:
    """``rank, start_ns, end_ns, op_class`` of each rank's ops on its device (local time)."""
    parts = []
    for ti, trace in enumerate(job.traces):  # per profile, not per event
        k = keys.filter(pl.col("trace_index") == ti).select("pid", "device_id", "rank")
        if k.is_empty():
            continue
        parts.append(
            trace.frame("gpu_ops").lazy()
            .filter((pl.col("start_ns") > 0) & (pl.col("end_ns") >= pl.col("start_ns")))
            .join(k.lazy(), on=["pid", "device_id"])
            .select("rank", "start_ns", "end_ns", "op_class").collect())
    return pl.concat(parts) if parts else pl.DataFrame(schema={
        "rank": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
        "op_class": schemas.OP_CLASS})


def _covered(ops: pl.DataFrame, classes: Sequence[str] | None, spans: pl.DataFrame
             ) -> pl.Series:
    """Per row of ``spans`` (``rank, start_ns, end_ns``): ns covered by the union of the
    rank's ops of ``classes`` (None: all)."""
    sel = ops if classes is None else ops.filter(pl.col("op_class").is_in(list(classes)))
    blocks = iv.union(sel.select(pl.col("rank").alias("device_id"), "start_ns", "end_ns"),
                      ["device_id"]).collect()
    return device_blocks.covered(
        blocks, spans.select(pl.col("rank").alias("device_id"), "start_ns", "end_ns"))


def _step_rows(run: str, ops: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    c = _covered(ops, ["compute"], steps)
    cn = _covered(ops, ["compute", "nccl"], steps)
    every = _covered(ops, None, steps)
    # the last compute kernel of each step: compute ops by the step their start lies in
    win = steps.select("rank", "step", pl.col("start_ns").alias("_ws"),
                       pl.col("end_ns").alias("_we"))
    last = (
        ops.filter(pl.col("op_class") == "compute").sort("start_ns")
        .join_asof(win.sort("_ws"), left_on="start_ns", right_on="_ws", by="rank",
                   strategy="backward", check_sortedness=False)
        .filter(pl.col("_ws").is_not_null() & (pl.col("start_ns") < pl.col("_we")))
        .group_by("rank", "step")
        .agg(pl.min_horizontal(pl.col("end_ns").max(), pl.col("_we").first())
             .alias("last_compute_end_ns"))
    )
    rows = steps.with_columns(
        c.alias("_c"), cn.alias("_cn"), every.alias("_all")).join(
        last, on=["rank", "step"], how="left")
    tail = rows.select("rank", pl.col("last_compute_end_ns").fill_null(pl.col("end_ns"))
                       .alias("start_ns"), "end_ns")
    tail_nccl = _covered(ops, ["nccl"], tail)
    return rows.with_columns(tail_nccl.alias("_tail_nccl")).select(
        pl.lit(run).alias("run"), "rank", "step", "start_ns", "end_ns", "duration_ns",
        pl.col("_c").alias("compute_ns"),
        (pl.col("_cn") - pl.col("_c")).alias("communication_ns"),
        (pl.col("_all") - pl.col("_cn")).alias("copies_ns"),
        (pl.col("duration_ns") - pl.col("_all")).alias("idle_ns"),
        "last_compute_end_ns",
        (pl.col("end_ns") - pl.col("last_compute_end_ns")).alias("end_gap_ns"),
        pl.when(pl.col("last_compute_end_ns").is_not_null()).then(pl.col("_tail_nccl"))
        .alias("end_gap_comm_ns"),
    ).cast(dict(STEP_ROWS)).sort("rank", "step")


def _layer_rows(run: str, job: JobResult, keys: pl.DataFrame, step_rows: pl.DataFrame
                ) -> pl.DataFrame:
    """``run, rank, step, item, kind, ns``: layers + outside + GPU idle per rank and step."""
    from nsysan.multirank.job import _rank_view
    from nsysan.passes import attribution

    parts = []
    for row in keys.iter_rows(named=True):  # per rank process, not per event
        trace = job.traces[row["trace_index"]]
        mine = step_rows.filter(pl.col("rank") == row["rank"])
        if mine.is_empty():
            continue
        several = keys.filter(pl.col("trace_index") == row["trace_index"]).height > 1
        view = _rank_view(trace, row["pid"]) if several else trace
        attr = attribution.run(view, attribution.AttributionParams(), {}).tables.get(
            "attribution")
        windows = mine.select("step", "start_ns", "end_ns", "duration_ns")
        per = layer_per_step(attr, windows) if attr is not None and attr.height else None
        owned = (per.group_by("step").agg(pl.col("ns").sum().alias("_owned"))
                 if per is not None else pl.DataFrame(schema={"step": pl.Int64,
                                                              "_owned": pl.Float64}))
        rest = mine.join(owned, on="step", how="left").select(
            "step", (pl.col("compute_ns") + pl.col("communication_ns") + pl.col("copies_ns")
                     - pl.col("_owned").fill_null(0)).cast(pl.Float64).alias("ns"))
        items = [
            rest.with_columns(pl.lit(OUTSIDE).alias("item"), pl.lit("layer").alias("kind")),
            mine.select("step", pl.col("idle_ns").cast(pl.Float64).alias("ns"),
                        pl.lit(GPU_IDLE).alias("item"), pl.lit("idle").alias("kind")),
        ]
        if per is not None:
            items.append(per.select("step", "ns", "item", pl.lit("layer").alias("kind")))
        parts.append(pl.concat([i.select("step", "item", "kind", "ns") for i in items])
                     .with_columns(pl.lit(row["rank"], pl.Int64).alias("rank")))
    if not parts:
        return pl.DataFrame(schema={"run": pl.String, "rank": pl.Int64, "step": pl.Int64,
                                    "item": pl.String, "kind": pl.String, "ns": pl.Float64})
    return pl.concat(parts).select(
        pl.lit(run).alias("run"), "rank", "step", "item", "kind", "ns").sort(
        "rank", "step", "kind", "item")


@dataclass(frozen=True)
class LinkParams:
    intra_node_gbps: float | None = None  # rated per-GPU link inside a node (NVLink / PCIe)
    inter_node_gbps: float | None = None  # rated per-GPU network bandwidth between nodes
    min_bytes: int = 16 << 20  # only collectives this large judge bandwidth
    low_share: float = 0.5  # transfer busbw below this share of the rated link: warning
    critical_share: float = 0.25

    def __post_init__(self) -> None:
        for name in ("intra_node_gbps", "inter_node_gbps"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ConfigError(f"{name} must be positive, got {v}")
        if not 0 < self.critical_share <= self.low_share <= 1:
            raise ConfigError("need 0 < critical_share <= low_share <= 1")


def _in_steps(job: JobResult, keys: pl.DataFrame, step_rows: pl.DataFrame) -> pl.DataFrame:
    """The NCCL ops of the ranks' processes that start in one of the (rank, step) windows."""
    ids = pl.DataFrame({"trace_id": [t.trace_id for t in job.traces],
                        "trace_index": list(range(len(job.traces)))},
                       schema={"trace_id": pl.String, "trace_index": pl.Int64})
    win = step_rows.select("rank", pl.col("start_ns").alias("_ws"),
                           pl.col("end_ns").alias("_we"))
    return (
        job.nccl.join(ids, on="trace_id").join(keys.select("trace_index", "pid", "rank"),
                                                on=["trace_index", "pid"])
        .sort("start_ns")
        .join_asof(win.sort("_ws"), left_on="start_ns", right_on="_ws", by="rank",
                   strategy="backward", check_sortedness=False)
        .filter(pl.col("_ws").is_not_null() & (pl.col("start_ns") < pl.col("_we")))
    )


def _collectives(run: str, job: JobResult, keys: pl.DataFrame, step_rows: pl.DataFrame,
                 coll: pl.DataFrame, n_steps: int, n_nodes: int | None, gpu_names: list[str],
                 link: LinkParams) -> pl.DataFrame:
    """Per NCCL op: count and time per step, exposed time, arrival skew, waiting, message size,
    transfer time and bus bandwidth, and the rated link it is compared with."""
    from nsysan.passes.nccl import nominal_link_gbps

    nccl = _in_steps(job, keys, step_rows)
    if nccl.is_empty():
        return pl.DataFrame()
    steps = max(n_steps, 1)
    pairs = max(step_rows.height, 1)  # (rank, step) pairs
    per_op = nccl.group_by("op").agg(
        (pl.len() / pairs).alias("n_per_step"),
        (pl.col("duration_ns").sum() / pairs).alias("duration_ns_per_step"),
        (pl.col("exposed_ns").sum() / pairs).alias("exposed_ns_per_step"),
        pl.col("bytes").median().alias("message_bytes"),
        pl.col("bytes").is_not_null().mean().alias("sized_frac"),
        pl.col("n_ranks").max(),
        pl.col("busbw_gbps").median().alias("kernel_busbw_gbps"),
    )
    coll = coll.filter(pl.col("kind") == "nccl")
    if not coll.is_empty():
        inst = coll.group_by("instance", "name").agg(
            (pl.col("end_ns").min() - pl.col("arrival_ns").max()).alias("transfer_ns"),
            pl.col("skew_ns").first(), pl.col("wait_imposed_ns").first())
        per_inst = inst.group_by(pl.col("name").alias("op")).agg(
            pl.col("transfer_ns").median(), pl.col("skew_ns").mean().alias("skew_ns_mean"),
            (pl.col("wait_imposed_ns").sum() / steps / job.ranks.height)
            .alias("wait_ns_per_step"))
        per_op = per_op.join(per_inst, on="op", how="left")
    else:
        per_op = per_op.with_columns(pl.lit(None, pl.Float64).alias(c) for c in (
            "transfer_ns", "skew_ns_mean", "wait_ns_per_step"))
    scope = ("unknown" if n_nodes is None else "inter-node" if n_nodes > 1 else "intra-node")
    rated = (link.inter_node_gbps if scope == "inter-node" else
             (link.intra_node_gbps or nominal_link_gbps(gpu_names)) if scope == "intra-node"
             else None)
    rated_from = ("user" if (scope == "inter-node" and link.inter_node_gbps) or
                  (scope == "intra-node" and link.intra_node_gbps) else
                  "nominal for the GPU model" if rated is not None else None)
    bw = with_bandwidth(per_op.select(
        "op", pl.col("message_bytes").cast(pl.Int64).alias("bytes"), "n_ranks",
        pl.col("transfer_ns").alias("duration_ns"))).select(
        "op", pl.col("busbw_gbps").alias("transfer_busbw_gbps"))
    return per_op.join(bw, on="op", how="left").with_columns(
        pl.lit(run).alias("run"), pl.lit(scope).alias("scope"),
        pl.lit(rated, pl.Float64).alias("rated_gbps"),
        pl.lit(rated_from, pl.String).alias("rated_from"),
    ).with_columns(
        (pl.col("transfer_busbw_gbps") / pl.col("rated_gbps")).alias("link_share"),
    ).select(
        "run", "op", "n_per_step", "duration_ns_per_step", "exposed_ns_per_step",
        "transfer_ns", "skew_ns_mean", "wait_ns_per_step", "message_bytes", "sized_frac",
        "n_ranks", "kernel_busbw_gbps", "transfer_busbw_gbps", "scope", "rated_gbps",
        "rated_from", "link_share",
    ).sort("op")


def _steady_collectives(job: JobResult, steps: pl.DataFrame) -> pl.DataFrame:
    """The matched collective rows (one per instance and rank) whose arrival lies in one of
    that rank's steady steps: step windows moved to the job timeline by the rank's clock
    offset."""
    coll = job.collectives
    if coll.is_empty() or steps.is_empty():
        return coll.head(0)
    win = steps.join(job.ranks.select("rank", "clock_offset_ns"), on="rank").select(
        "rank", (pl.col("start_ns") + pl.col("clock_offset_ns")).alias("_ws"),
        (pl.col("end_ns") + pl.col("clock_offset_ns")).alias("_we"))
    return (
        coll.sort("arrival_ns")
        .join_asof(win.sort("_ws"), left_on="arrival_ns", right_on="_ws", by="rank",
                   strategy="backward", check_sortedness=False)
        .filter(pl.col("_ws").is_not_null() & (pl.col("arrival_ns") < pl.col("_we")))
        .drop("_ws", "_we")
    )


def _ranks(run: str, job: JobResult, steps: pl.DataFrame, coll: pl.DataFrame,
           min_skew_ns: int) -> pl.DataFrame:
    """Per rank: means per steady step, and the collectives it arrived last at in its steady
    steps with the waiting that imposed on the others (summed over them) and its own wait."""
    n = max(steps["step"].n_unique(), 1) if not steps.is_empty() else 1
    per = steps.group_by("rank").agg(
        pl.col("duration_ns").mean().alias("step_ns"),
        pl.col("end_gap_ns").mean().alias("end_gap_ns"),
        pl.col("communication_ns").mean().alias("communication_ns"),
        pl.col("idle_ns").mean().alias("idle_ns"),
    )
    last = (pl.col("last_rank") == pl.col("rank")) & (pl.col("skew_ns") >= min_skew_ns)
    waits = coll.group_by("rank").agg(
        last.sum().cast(pl.Int64).alias("n_last"),
        pl.col("wait_ns").sum().alias("_wait"),
        pl.col("wait_imposed_ns").filter(pl.col("last_rank") == pl.col("rank")).sum()
        .alias("_imposed"),
    ) if not coll.is_empty() else pl.DataFrame(schema={
        "rank": pl.Int64, "n_last": pl.Int64, "_wait": pl.Int64, "_imposed": pl.Int64})
    info = job.ranks.select("rank", "hostname")
    return info.join(per, on="rank", how="left").join(waits, on="rank", how="left").select(
        pl.lit(run).alias("run"), "rank", "hostname", "step_ns", "end_gap_ns",
        "communication_ns", "idle_ns", pl.col("n_last").fill_null(0),
        (pl.col("_wait").fill_null(0) / n).alias("wait_ns_per_step"),
        (pl.col("_imposed").fill_null(0) / n).alias("wait_imposed_ns_per_step"),
    ).sort("rank")


def _mix(job: JobResult, keys: pl.DataFrame) -> tuple[dict[str, float], dict[str, float]]:
    """Compute-kernel time shares and launch shares by kernel name (the workload signature;
    NCCL kernels are left out: their share grows with scale by design)."""
    parts = []
    for ti, trace in enumerate(job.traces):
        pids = keys.filter(pl.col("trace_index") == ti)["pid"].implode()
        parts.append(trace.frame("gpu_ops").lazy().filter(
            (pl.col("op_class") == "compute") & pl.col("pid").is_in(pids))
            .select("name", (pl.col("end_ns") - pl.col("start_ns")).alias("d")).collect())
    ops = pl.concat(parts) if parts else pl.DataFrame(schema={"name": schemas.CAT,
                                                              "d": pl.Int64})
    g = ops.group_by("name").agg(pl.col("d").sum(), pl.len().alias("n")).sort("name")
    td, tn = g["d"].sum(), g["n"].sum()
    names = [n or "" for n in g["name"].to_list()]
    time_mix = dict(zip(names, (g["d"] / td).to_list(), strict=True)) if td else {}
    launch_mix = dict(zip(names, (g["n"] / tn).to_list(), strict=True)) if tn else {}
    return time_mix, launch_mix


def expand_run(spec: str) -> list[str]:
    """A RUN argument: a profile, a folder of rank profiles, profiles joined by commas, or an
    ``nsysan analyze`` / ``nsysan batch`` output folder, which stands for the profiles it
    analysed (`profiles_of_output`)."""
    parts = [p for p in spec.split(",") if p]
    if not parts:
        raise ConfigError(f"empty run {spec!r}")
    out: list[str] = []
    for p in parts:
        d = Path(p)
        analysed = profiles_of_output(d)
        if analysed is not None:
            out += analysed
            continue
        if any((d / n).is_file() for n in ("ranks.parquet", MARKER)):
            raise ConfigError(f"{p}: an nsysan job or comparison output folder; nsysan "
                              "scaling reads the rank profiles: pass them or their folder")
        out.append(p)
    return out


def profiles_of_output(d: Path) -> list[str] | None:
    """The profiles an analyze output folder (``manifest.json`` in it) or a batch / analyze
    root (one per subfolder) analysed, from the manifests; None when ``d`` is no such folder.
    The per-rank timelines a scaling analysis needs are not in the outputs, so the profiles
    are read again: each must still be where the manifest says, with the recorded sha256."""
    import json

    from nsysan.report.manifest import describe_path

    if not d.is_dir():
        return None
    from nsysan.load.parquetdir import is_parquetdir

    if any(p.suffix.lower() in (".sqlite", ".nsys-rep", ".qdrep") or is_parquetdir(p)
           for p in d.iterdir()):
        return None  # a folder of profiles (perhaps with analyses beside them)
    # batch names outputs by the input's relative path: they can sit several folders deep
    manifests = ([d / "manifest.json"] if (d / "manifest.json").is_file() else sorted(
        m for m in d.rglob("manifest.json")
        if not any(part.startswith(".") for part in m.relative_to(d).parts)))
    if not manifests:
        return None
    paths = []
    for m in manifests:  # one per analysed profile
        try:
            inputs = json.loads(m.read_text(encoding="utf-8")).get("inputs") or []
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{m}: unreadable manifest ({exc})") from None
        if not inputs or not inputs[0].get("path"):
            raise ConfigError(f"{m}: the manifest names no input profile")
        given = inputs[0]
        now = describe_path(Path(given["path"]))
        if now["kind"] == "missing":
            raise ConfigError(f"{m}: the profile it analysed, {given['path']}, is not there any "
                              "more: pass the rank profiles themselves")
        if given.get("sha256") and now["sha256"] != given["sha256"]:
            raise ConfigError(f"{m}: {given['path']} changed since it was analysed (sha256 "
                              "differs): pass the profiles, or analyse them again")
        paths.append(str(given["path"]))
    return paths


#: host findings that point to CPU binding (nsysan.findings.rules_host)
HOST_BINDING_CODES = ("CPU_CONTENTION", "HOST_CPU_BOUND")


def host_evidence(job: JobResult) -> tuple[bool, list[str]]:
    """Whether any rank profile of ``job`` carries host evidence (CPU samples or context
    switches), and the host findings of warning or worse in those profiles
    (``"CODE (trace_id)"``, sorted). Only profiles with the tables are analysed again, with
    the host pass alone (and the passes it needs)."""
    from nsysan.api import analyze

    captured = False
    hits: set[str] = set()
    for t in job.traces:
        tables = t.meta.tables
        if not (tables.has_rows("SCHED_EVENTS") or tables.has_rows("COMPOSITE_EVENTS")):
            continue
        captured = True
        diagnosis = analyze(t, passes=["host"], findings=True).diagnosis
        for f in diagnosis.findings if diagnosis is not None else []:
            if f.code in HOST_BINDING_CODES and f.severity in ("warning", "critical"):
                hits.add(f"{f.code} ({t.trace_id})")
    return captured, sorted(hits)


def measure_run(spec: str | Sequence[str | os.PathLike[str]], *, label: str | None = None,
                link: LinkParams | None = None, job_params: JobParams | None = None,
                nsys: str | None = None) -> ScaleRun:
    """Measure one job (see the module docstring)."""
    paths = expand_run(spec) if isinstance(spec, str) else [str(p) for p in spec]
    link = link or LinkParams()
    job_params = job_params or JobParams()
    job = analyze_job(paths, params=job_params, nsys=nsys)
    notes = list(job.notes)
    keys = _rank_keys(job)
    steps = _steady(job, keys, notes)
    ops = _rank_ops(job, keys)
    n_gpus = sum(
        t.frame("gpu_ops").select(pl.col("pid", "device_id").filter(pl.col("pid").is_in(
            keys.filter(pl.col("trace_index") == ti)["pid"].implode())))
        .unique().height
        for ti, t in enumerate(job.traces))
    hosts = job.ranks["hostname"]
    n_nodes = None if hosts.null_count() else hosts.n_unique()
    gpu_names = sorted({n for t in job.traces for n in t.frame("gpus")["name"].to_list() if n})
    run = label or (spec if isinstance(spec, str) else job.job_id)
    rows = _step_rows(run, ops, steps) if not steps.is_empty() else pl.DataFrame(
        schema=STEP_ROWS)
    layers = _layer_rows(run, job, keys, rows)
    n_steps = rows["step"].n_unique() if not rows.is_empty() else 0
    if job.nccl.height and job.nccl["bytes"].null_count() == job.nccl.height:
        notes.append("NCCL message sizes unknown (no NVTX payloads in these profiles): bus "
                     "bandwidth not measured, the duration-based analysis stands")
    time_mix, launch_mix = _mix(job, keys)
    coll = _steady_collectives(job, rows)
    host_captured, host_findings = host_evidence(job)
    return ScaleRun(
        run=run, source=", ".join(paths), n_gpus=n_gpus, n_ranks=job.ranks.height,
        n_nodes=n_nodes, steps=rows, layers=layers,
        collectives=_collectives(run, job, keys, rows, coll, n_steps, n_nodes, gpu_names, link),
        ranks=_ranks(run, job, rows, coll, job_params.min_skew_ns), kernel_mix=time_mix,
        launch_mix=launch_mix,
        gpu_names=gpu_names, job=job, notes=notes, host_findings=host_findings,
        host_captured=host_captured,
    )
