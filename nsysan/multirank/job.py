"""Analyze the profiles of one distributed job together: ranks, clocks, collectives, stragglers.

``analyze_job`` takes several reports (one per rank), a job directory, one report holding
several rank processes, or already opened traces, and returns a `JobResult`:

- ``ranks`` (schema `schemas.RANKS`): per rank, where it came from and how its rank was
  found (`nsysan.multirank.ranks`), its clock offset, time to first activity / kernel /
  collective on the job timeline (0 = the earliest session start), step time (steps pass on
  that rank's process), GPU busy share, NCCL time and exposed NCCL time, MPI/NCCL host time,
  and how often it arrived last at collectives and what that cost the others;
- ``collectives`` (schema `schemas.COLLECTIVES`): one row per matched collective instance and
  rank (`nsysan.multirank.align`);
- findings: stragglers (`nsysan.multirank.stragglers`), start-up skew, exposed communication
  per rank and step, low NCCL bus bandwidth.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from nsysan.errors import ConfigError, TraceFormatError
from nsysan.escape import md_cell, md_text
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.text import per_value
from nsysan.frames.trace import Trace
from nsysan.load.files import check_openable
from nsysan.load.files import job_files as job_files  # re-exported: it lived here
from nsysan.multirank import align
from nsysan.multirank.ranks import (
    MPI_OR_NCCL_API_RE,
    assign_ranks,
    env_of_trace,
    rank_candidates,
    world_size_from_env,
)
from nsysan.multirank.stragglers import find_stragglers, local_intervals, to_job_time
from nsysan.passes import nccl as nccl_pass
from nsysan.passes.base import Finding
from nsysan.passes.schedule import analysis_context

DATA_PATTERN = r"(?i)(data|loader|loading|fetch|prefetch|reader|dali|collate|next_batch|get_batch)"


@dataclass(frozen=True)
class JobParams:
    n_ranks: int | None = None  # communicator size for bandwidths (default: profile evidence)
    refine_clocks: bool = True  # refine session-start alignment with collective end times
    min_matched: int = 3  # matched instances a profile needs for clock refinement
    max_shift: int = 3  # sequence shifts tried when ranks recorded different counts
    min_skew_ns: int = 100_000  # arrival skew below this: nobody counts as last
    straggler_share: float = 0.5
    min_straggler_events: int = 3
    min_wait_frac: float = 0.01  # imposed waiting vs the straggler's GPU span
    period_min_match: float = 0.6
    startup_skew_ns: int = 500_000_000  # first-collective spread across ranks: warning
    exposed_warn_frac: float = 0.10  # exposed NCCL / span of a rank: warning
    data_pattern: str = DATA_PATTERN  # NVTX ranges that mean data loading (regex)

    def __post_init__(self) -> None:
        if self.n_ranks is not None and self.n_ranks < 1:
            raise ConfigError(f"job n_ranks must be >= 1, got {self.n_ranks}")
        if not 0 < self.straggler_share <= 1:
            raise ConfigError("job straggler_share must be in (0, 1]")
        try:
            pl.Series([""]).str.contains(self.data_pattern)
        except pl.exceptions.PolarsError:
            raise ConfigError(f"job data_pattern: invalid regex {self.data_pattern!r}") from None


@dataclass
class JobResult:
    job_id: str
    traces: list[Trace]
    ranks: pl.DataFrame
    collectives: pl.DataFrame
    nccl: pl.DataFrame  # the NCCL tables of every profile (schema `schemas.NCCL`)
    findings: list[Finding] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: the steps pass table of every rank process (local time) with ``rank``, ``trace_index``
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)

    @property
    def tables(self) -> dict[str, pl.DataFrame]:
        return {"ranks": self.ranks, "collectives": self.collectives}


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
_JOB_FILES = frozenset({"ranks.parquet", "collectives.parquet", "job_findings.md"})


def _open(items: Iterable[str | os.PathLike[str] | Trace], nsys: str | None,
          frame_cache: bool | None = None) -> list[Trace]:
    expanded: list[Path | Trace] = []
    for item in items:
        if isinstance(item, Trace):
            expanded.append(item)
            continue
        p = Path(item)
        check_openable(p)  # missing, a pipe, a symlink loop: one line saying which
        from nsysan.load.parquetdir import is_parquetdir

        if p.is_dir() and not is_parquetdir(p):
            expanded.extend(job_files(p))
        else:
            expanded.append(p)
    traces = []
    for item in expanded:
        if isinstance(item, Trace):
            traces.append(item)
        else:
            from nsysan.load import open_trace

            traces.append(open_trace(item, nsys=nsys, frame_cache=frame_cache))
    if not traces:
        raise ConfigError("analyze_job: no profiles given")
    return traces


# ---------------------------------------------------------------------------------------------
# Per rank
# ---------------------------------------------------------------------------------------------
def _rank_view(trace: Trace, pid: int) -> Trace:
    """The frames of one process of ``trace`` as a trace of its own."""
    frames = {}
    for name in schemas.CANONICAL:
        if name != "meta" and not trace.has(name):
            continue
        df = trace.frame(name)
        frames[name] = df.filter(pl.col("pid") == pid) if "pid" in df.columns else df
    return Trace.from_frames(
        f"{trace.trace_id}#pid{pid}", frames, path=trace.meta.path,
        session_start_utc_ns=trace.meta.session_start_utc_ns,
    )


def _steps(view: Trace) -> pl.DataFrame:
    try:
        from nsysan.passes import steps as steps_pass
    except ImportError:  # steps pass not installed in this build
        return schemas.empty(schemas.STEPS)
    with analysis_context(view) as shared:  # the steps' sweeps are shared within the pass
        return steps_pass.run(shared, steps_pass.StepsParams(), {}).tables["steps"]


def _local_metrics(trace: Trace, rows: pl.DataFrame) -> pl.DataFrame:
    """Per rank process of one profile (local time): activity, busy, NCCL and host comm."""
    keys = rows.select("pid", "device_id")
    # (the columns read, then the join: a join of the whole frame would expand its constant
    # columns to every row, `nsysan.frames.trace`)
    ops = (trace.frame("gpu_ops").select("pid", "device_id", "kind", "op_class", "start_ns",
                                         "end_ns")
           .join(keys, on=["pid", "device_id"]))
    by = ["pid"]
    first_parts = [
        trace.frame(f).lazy().group_by("pid").agg(pl.col("start_ns").min().alias("_s"))
        for f in ("gpu_ops", "cuda_api", "nvtx")
    ]
    first = pl.concat(first_parts).group_by("pid").agg(pl.col("_s").min().alias("first_local"))
    span = ops.lazy().group_by(by).agg(
        pl.col("start_ns").min().alias("_span_s"), pl.col("end_ns").max().alias("_span_e"),
        pl.col("start_ns").filter(pl.col("kind") == "kernel").min().alias("first_kernel_local"),
    )
    busy = iv.total(ops, by, name="busy_ns")
    compute = ops.filter(pl.col("op_class") == "compute")
    nccl_u = iv.union(ops.filter(pl.col("op_class") == "nccl"), by)
    comm = (
        iv.covered(nccl_u, compute.select(*by, "start_ns", "end_ns"), by)
        .group_by(by)
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("comm_ns"),
             (pl.col("end_ns") - pl.col("start_ns") - pl.col("covered_ns")).sum()
             .alias("exposed_comm_ns"))
    )
    nvtx = trace.frame("nvtx")
    host = iv.total(
        nvtx.select(pl.col("pid", "start_ns", "end_ns").filter(
            (pl.col("style") != "mark")
            & per_value(nvtx, "name", pl.col("name").str.contains(MPI_OR_NCCL_API_RE))
            .fill_null(False)
        )), by, name="host_comm_ns",
    )
    return (
        keys.lazy().select("pid")
        .join(first, on="pid", how="left")
        .join(span, on="pid", how="left")
        .join(busy, on="pid", how="left")
        .join(comm, on="pid", how="left")
        .join(host, on="pid", how="left")
        .with_columns(
            (pl.col("_span_e") - pl.col("_span_s")).alias("span_ns"),
            pl.col("comm_ns").fill_null(0), pl.col("exposed_comm_ns").fill_null(0),
            pl.col("host_comm_ns").fill_null(0), pl.col("busy_ns").fill_null(0),
        )
        .drop("_span_s", "_span_e")
        .collect()
    )


def _step_stats(steps: pl.DataFrame) -> dict[str, Any]:
    if steps.is_empty():
        return {"n_steps": 0, "step_time_ns": None, "exposed_comm_per_step_ns": None}
    steady = steps.filter(~pl.col("warmup"))
    steady = steady if not steady.is_empty() else steps
    return {
        "n_steps": steps.height,
        "step_time_ns": float(steady["duration_ns"].median()),  # type: ignore[arg-type]
        "exposed_comm_per_step_ns": float(steady["exposed_nccl_ns"].median()),  # type: ignore[arg-type]
    }


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------
def _provisional(t_index: int | pl.Expr, pid: pl.Expr) -> pl.Expr:
    """A rank process's key before the job's ranks are numbered: profile and pid in one
    integer (a pid has 24 bits)."""
    return (pl.lit(t_index, pl.Int64) if isinstance(t_index, int) else t_index.cast(pl.Int64)) \
        * (1 << 24) + pid.cast(pl.Int64)


def _job_id(traces: Sequence[Trace], given: str | None) -> str:
    if given:
        return given
    ids = [t.trace_id for t in traces]
    n = 0
    for chars in zip(*ids, strict=False):  # characters shared by every id, left to right
        if len(set(chars)) != 1:
            break
        n += 1
    prefix = ids[0][:n].rstrip("._-#") if len(ids) > 1 else ids[0]
    return prefix or "job"


def analyze_job(
    paths_or_traces: str | os.PathLike[str] | Trace | Iterable[str | os.PathLike[str] | Trace],
    rank_map: Mapping[Any, int] | None = None,
    *,
    params: JobParams | None = None,
    job_id: str | None = None,
    nsys: str | None = None,
    frame_cache: bool | None = None,
) -> JobResult:
    """Analyze the profiles of one job together (see the module doc).

    ``paths_or_traces``: report / export paths, a job directory, traces, or a mix. One
    profile holding several rank processes is fine. ``rank_map`` maps a path or trace id
    (or ``(trace_id, pid)``) to its rank when the profiles cannot tell. ``frame_cache`` is
    `nsysan.load.open_trace`'s.
    """
    params = params or JobParams()
    if isinstance(paths_or_traces, (str, os.PathLike, Trace)):
        paths_or_traces = [paths_or_traces]
    traces = _open(paths_or_traces, nsys, frame_cache)
    jid = _job_id(traces, job_id)
    notes: list[str] = []
    coarse, cnotes = align.coarse_offsets([t.meta.session_start_utc_ns for t in traces])
    notes += cnotes
    nccl_params = nccl_pass.NcclParams(n_ranks=params.n_ranks)
    candidates, nccl_tables, gpu_names, local, steps_parts, events, intervals_local = (
        [], [], [], [], [], [], [])
    world = params.n_ranks
    # One profile at a time, its frames released before the next is read: a job's memory
    # is that of its largest profile, not of all of them. Ranks get their job-wide numbers
    # only once every profile is seen (`assign_ranks`); until then each rank process is
    # keyed by its profile and pid (a provisional rank, `_provisional`).
    for t_index, trace in enumerate(traces):  # per profile and rank process, not per event
        rows = rank_candidates(t_index, trace, rank_map)
        candidates.append(rows)
        world = world or world_size_from_env(env_of_trace(trace))
        if not rows.is_empty():
            rows = rows.with_columns(rank=_provisional(t_index, pl.col("pid")))
            with analysis_context(trace) as shared:  # the NCCL ops share the unions
                nccl_tables.append(nccl_pass.nccl_ops(shared, nccl_params))
            gpu_names.append(trace.frame("gpus")["name"].to_list())
            local.append(_local_metrics(trace, rows).with_columns(pl.lit(t_index).alias(
                "trace_index")))
            events.append(align.mpi_events(trace.frame("nvtx"), rows))
            intervals_local.append((t_index, local_intervals(trace, rows["pid"],
                                                             params.data_pattern)))
            for row in rows.iter_rows(named=True):
                view = trace if rows.height == 1 else _rank_view(trace, row["pid"])
                st = _steps(view)
                steps_parts.append(st.with_columns(pl.lit(row["rank"]).alias("rank"),
                                                   pl.lit(t_index).alias("trace_index")))
        trace.release()
    ranks = assign_ranks(candidates)
    if ranks.is_empty():
        raise TraceFormatError("analyze_job: no process with GPU work or MPI/NCCL ranges found "
                               "in the given profiles")
    final = ranks.select(_p=_provisional(pl.col("trace_index"), pl.col("pid")), _r="rank")

    def renumbered(df: pl.DataFrame) -> pl.DataFrame:
        """``df`` with each provisional rank replaced by the job's rank number."""
        return (df.join(final, left_on="rank", right_on="_p", how="left", maintain_order="left")
                .with_columns(pl.col("_r").alias("rank")).drop("_r"))

    n_default = world or ranks.height
    nccl_tables = [nccl_pass.with_default_ranks(t, n_default) for t in nccl_tables]
    findings = [f for table, names in zip(nccl_tables, gpu_names, strict=True)
                for f in nccl_pass.low_bandwidth_findings(table, nccl_params,
                                                          lambda n=names: n)]
    nccl_all = pl.concat(nccl_tables) if nccl_tables else schemas.empty(schemas.NCCL)
    events = [renumbered(e) for e in events]
    steps_parts = [renumbered(st) for st in steps_parts]
    events.append(align.nccl_events(nccl_all, ranks))
    ev = align.number(pl.concat([e.select(list(align.EVENT_SCHEMA)) for e in events]))
    ev = ev.join(coarse, on="trace_index").with_columns(
        (pl.col("end_local") + pl.col("coarse_ns")).alias("job_end")
    )
    matched = align.match(ev, params.max_shift, params.min_matched)
    ref_trace = int(ranks.sort("rank")["trace_index"][0])
    fit = align.fit_clocks(matched, coarse, ref_trace, params.refine_clocks, params.min_matched)
    notes += fit.notes
    offsets = fit.offsets()
    matched = matched.join(offsets, on="trace_index").with_columns(
        (pl.col("arrival_local") + pl.col("offset_ns")).alias("arrival_ns"),
        (pl.col("end_local") + pl.col("offset_ns")).alias("end_ns"),
    )
    coll = align.instances(matched, jid)

    steps_all = pl.concat(steps_parts) if steps_parts else pl.DataFrame()
    rank_table = _ranks_table(jid, ranks, local, fit, steps_all, matched, coll, params)
    intervals = to_job_time(intervals_local, ranks, offsets)
    steps_job = (
        steps_all.join(offsets, on="trace_index")
        .select("rank", "step", (pl.col("start_ns") + pl.col("offset_ns")).alias("start_ns"))
        if not steps_all.is_empty() else pl.DataFrame(schema={"rank": pl.Int64,
                                                              "step": pl.Int64,
                                                              "start_ns": pl.Int64})
    )
    s_findings, s_metrics = find_stragglers(
        coll, rank_table, intervals, steps_job,
        min_skew_ns=params.min_skew_ns, straggler_share=params.straggler_share,
        min_straggler_events=params.min_straggler_events, min_wait_frac=params.min_wait_frac,
        period_min_match=params.period_min_match,
    )
    findings = s_findings + _startup_findings(rank_table, params) + \
        _exposed_findings(rank_table, params) + findings
    metrics: dict[str, Any] = {
        "n_ranks": ranks.height, "n_profiles": len(traces),
        "n_instances": int(coll["instance"].n_unique()) if not coll.is_empty() else 0,
        "max_skew_ns": int(coll["skew_ns"].max()) if not coll.is_empty() else None,  # type: ignore[arg-type]
        "median_end_spread_ns": (float(coll["end_spread_ns"].median())  # type: ignore[arg-type]
                                 if not coll.is_empty() else None),
        **fit.summary(), **s_metrics,
    }
    return JobResult(jid, traces, rank_table, coll, nccl_all, findings, metrics, notes,
                     steps=steps_all)


def _ranks_table(jid: str, ranks: pl.DataFrame, local: list[pl.DataFrame], fit: align.ClockFit,
                 steps: pl.DataFrame, matched: pl.DataFrame, coll: pl.DataFrame,
                 params: JobParams) -> pl.DataFrame:
    from nsysan.multirank.stragglers import per_rank_stats

    loc = pl.concat(local) if local else pl.DataFrame()
    step_rows = []
    for r in ranks["rank"].to_list():  # one per rank
        part = steps.filter(pl.col("rank") == r) if not steps.is_empty() else steps
        step_rows.append({"rank": r, **_step_stats(part)})
    step_df = pl.DataFrame(step_rows, schema={"rank": pl.Int64, "n_steps": pl.Int64,
                                              "step_time_ns": pl.Float64,
                                              "exposed_comm_per_step_ns": pl.Float64})
    first_coll = matched.group_by("rank").agg(pl.col("arrival_ns").min().alias("_fc")) \
        if not matched.is_empty() else pl.DataFrame(schema={"rank": pl.Int64, "_fc": pl.Int64})
    stats = per_rank_stats(coll, params.min_skew_ns) if not coll.is_empty() else \
        pl.DataFrame(schema={"rank": pl.Int64, "n_collectives": pl.Int64, "n_last": pl.Int64,
                             "wait_ns": pl.Int64, "wait_imposed_ns": pl.Int64})
    clocks = fit.table.select("trace_index", "coarse_ns", "refine_ns")
    table = (
        ranks.join(loc, on=["trace_index", "pid"], how="left")
        .join(clocks, on="trace_index", how="left")
        .join(step_df, on="rank", how="left")
        .join(first_coll, on="rank", how="left")
        .join(stats, on="rank", how="left")
        .with_columns((pl.col("coarse_ns") + pl.col("refine_ns")).alias("clock_offset_ns"))
        .with_columns(
            pl.lit(jid).alias("trace_id"),
            pl.col("trace_id").alias("source_trace_id"),
            pl.col("refine_ns").alias("clock_refine_ns"),
            (pl.col("first_local") + pl.col("clock_offset_ns")).alias("first_activity_ns"),
            (pl.col("first_kernel_local") + pl.col("clock_offset_ns")).alias("first_kernel_ns"),
            pl.col("_fc").alias("first_collective_ns"),
            pl.when(pl.col("span_ns") > 0).then(pl.col("busy_ns") / pl.col("span_ns"))
            .alias("busy_frac"),
            pl.when(pl.col("span_ns") > 0).then(pl.col("exposed_comm_ns") / pl.col("span_ns"))
            .alias("exposed_comm_frac"),
            *(pl.col(c).fill_null(0) for c in ("n_collectives", "n_last", "wait_ns",
                                                "wait_imposed_ns")),
        )
        .sort("rank")
    )
    # trace_id was the source profile's id until here; conform keeps the renamed columns.
    return schemas.conform(table, schemas.RANKS)


def _startup_findings(ranks: pl.DataFrame, params: JobParams) -> list[Finding]:
    out = []
    for col, what in (("first_collective_ns", "first collective"),
                      ("first_kernel_ns", "first kernel")):
        vals = ranks.select("rank", col).drop_nulls()
        if vals.height < 2:
            continue
        lo, hi = vals[col].min(), vals[col].max()
        skew = int(hi - lo)  # type: ignore[operator]
        if skew < params.startup_skew_ns:
            continue
        late = int(vals.sort(col)["rank"][-1])
        early = int(vals.sort(col)["rank"][0])
        out.append(Finding(
            code="RANK_STARTUP_SKEW", severity="warning", layer="communication",
            title="Ranks start at different times",
            message=(
                f"Time to {what} differs by {skew / 1e6:.0f} ms across {vals.height} ranks: "
                f"rank {early} at {lo / 1e9:.2f} s, rank {late} at {hi / 1e9:.2f} s after the "
                "job's first session start. Every rank waits for the slowest at the first "
                "collective: look at the late rank's initialisation (data set, NCCL init, "
                "module loading)."
            ),
            evidence={"what": what, "skew_ns": skew, "latest_rank": late, "earliest_rank": early,
                      "per_rank_ns": dict(vals.iter_rows())},
        ))
        break  # the first collective says it; the first kernel only when no collective
    return out


def _exposed_findings(ranks: pl.DataFrame, params: JobParams) -> list[Finding]:
    hot = ranks.filter(pl.col("exposed_comm_frac") >= params.exposed_warn_frac).sort("rank")
    if hot.is_empty():
        return []
    worst = hot.sort("exposed_comm_frac", descending=True).row(0, named=True)
    per_step = worst["exposed_comm_per_step_ns"]
    step_txt = f", {per_step / 1e6:.1f} ms per step" if per_step else ""
    return [Finding(
        code="EXPOSED_COMMUNICATION",
        severity="critical" if worst["exposed_comm_frac"] >= 0.25 else "warning",
        layer="communication",
        title="Exposed communication (NCCL not overlapped with compute)",
        message=(
            f"{hot.height} of {ranks.height} ranks spend at least "
            f"{params.exposed_warn_frac:.0%} of their GPU span in NCCL with no compute beside "
            f"it; worst is rank {worst['rank']}: {worst['exposed_comm_ns'] / 1e6:.1f} ms "
            f"({worst['exposed_comm_frac']:.0%}){step_txt}."
        ),
        evidence={"per_rank_exposed_ns": dict(hot.select("rank", "exposed_comm_ns").iter_rows()),
                  "per_rank_exposed_per_step_ns": dict(
                      hot.select("rank", "exposed_comm_per_step_ns").iter_rows())},
    )]


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v / 1e6:.1f}"


def job_markdown(result: JobResult) -> str:
    m = result.metrics
    lines = [f"# Job {result.job_id}", "",
             f"{m.get('n_ranks')} ranks from {m.get('n_profiles')} profiles; "
             f"{m.get('n_instances')} matched collective instances; clock residual "
             f"{_ms(m.get('clock_residual_ns'))} ms.", "",
             "| rank | profile | pid | found by | clock offset ms | first kernel s | "
             "step ms | busy % | exposed comm ms | last at | wait imposed ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.ranks.iter_rows(named=True):  # one line per rank
        fk = r["first_kernel_ns"]
        busy = r["busy_frac"]
        lines.append(
            f"| {r['rank']} | {md_text(r['source_trace_id'])} | {r['pid']} | "
            f"{md_text(r['rank_source'])} | "
            f"{_ms(r['clock_offset_ns'])} | {'—' if fk is None else f'{fk / 1e9:.2f}'} | "
            f"{_ms(r['step_time_ns'])} | {'—' if busy is None else f'{busy:.0%}'} | "
            f"{_ms(r['exposed_comm_ns'])} | {r['n_last']} | {_ms(r['wait_imposed_ns'])} |"
        )
    lines += ["", "## Findings", ""]
    if not result.findings:
        lines.append("No stragglers, start-up skew or exposed communication found.")
    for f in result.findings:
        # messages are Markdown whose trace strings are code spans (`md_code`)
        lines.append(f"- **{f.severity}** `{f.code}` ({f.layer}): {md_cell(f.message)}")
    if result.notes:
        lines += ["", "## Notes", "", *(f"- {md_text(n)}" for n in result.notes)]
    return "\n".join(lines) + "\n"


def write_job_outputs(result: JobResult, out_dir: str | os.PathLike[str], *,
                      protect: Any = None) -> Path:
    """Write ranks.parquet, collectives.parquet and job_findings.md into ``out_dir`` atomically;
    an existing ``out_dir`` is replaced only as `nsysan.report.ownership` allows."""
    from nsysan.report.atomic import atomic_write
    from nsysan.report.ownership import legacy_files, replacing
    from nsysan.report.parquet import write_table

    out = Path(out_dir)
    with replacing(out.parent, out.name, kind="job", inputs=[t.meta.path for t in result.traces],
                   protect=protect, legacy=legacy_files(_JOB_FILES.__contains__,
                                                        "job_findings.md")) as folder:
        for name, df in result.tables.items():
            write_table(df, folder.tmp / f"{name}.parquet", schemas.JOB_OUTPUTS[name])
        atomic_write(folder.tmp / "job_findings.md", job_markdown(result))
        return folder.commit()
