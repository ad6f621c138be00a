"""Collective events per rank, matching across ranks, and clock alignment.

**Events.** Per rank: every NCCL kernel (arrival = kernel start, end = kernel end; key = op
and the ordinal of its stream among the rank's NCCL streams, so two communicators on two
streams are kept apart) and every MPI collective NVTX range (``MPI_Allreduce``, ...; key =
the name). A collective's kernels / calls all end together once the last rank has arrived;
they start when each rank arrives.

**Matching.** Within a key, the i-th occurrence on one rank is the i-th on the reference rank
(the lowest rank having the key). When a profile was cut (time-sliced, capture range) the
counts differ; then the sequence shift in ``[-max_shift, max_shift]`` that makes end times
agree best (``|median diff| + MAD``) is taken, when it is at least twice as good as no shift.

**Clocks.** Coarse: every profile's times are shifted by its session start (UTC) minus the
earliest session start of the job, so job time 0 is the first session start. Refinement:
collective ends are simultaneous across ranks, so for every profile other than the
reference one (the profile of the lowest rank) the median of ``end - reference end`` over
matched instances estimates what its clock is off by; it is subtracted. The **residual** of a
profile is the median absolute deviation of those differences around their median: how well
a single offset explains them. Processes of one profile share one clock and one offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from nsysan.frames import schemas
from nsysan.frames.text import per_value

MPI_COLLECTIVE_RE = (
    r"^MPI_(Allreduce|Reduce|Bcast|Barrier|Allgather|Allgatherv|Alltoall|Alltoallv|Alltoallw"
    r"|Reduce_scatter|Reduce_scatter_block|Gather|Gatherv|Scatter|Scatterv|Scan|Exscan)$"
)
P2P_OPS = ("SendRecv", "Send", "Recv")

EVENT_SCHEMA = {
    "rank": pl.Int64, "trace_index": pl.Int64, "kind": pl.String, "key": pl.String,
    "name": pl.String, "p2p": pl.Boolean, "arrival_local": pl.Int64, "end_local": pl.Int64,
}


def nccl_events(nccl: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Collective events from the NCCL tables (``trace_id`` + ``pid`` identify the rank)."""
    if nccl.is_empty():
        return pl.DataFrame(schema=EVENT_SCHEMA)
    streams = (
        nccl.group_by("trace_id", "pid", "device_id", "stream_id")
        .agg(pl.col("start_ns").min().alias("_first"))
        .sort("trace_id", "pid", "_first", "stream_id")
        .with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).over("trace_id", "pid").alias("_ord")
        )
    )
    return (
        nccl.join(streams, on=["trace_id", "pid", "device_id", "stream_id"])
        .join(ranks.select("trace_id", "pid", "rank", "trace_index"), on=["trace_id", "pid"])
        .select(
            "rank", "trace_index", pl.lit("nccl").alias("kind"),
            (pl.col("op") + pl.lit("@stream") + pl.col("_ord").cast(pl.String)).alias("key"),
            pl.col("op").alias("name"), pl.col("op").is_in(P2P_OPS).alias("p2p"),
            pl.col("start_ns").alias("arrival_local"), pl.col("end_ns").alias("end_local"),
        )
    )


def mpi_events(nvtx: pl.DataFrame, rank_rows: pl.DataFrame) -> pl.DataFrame:
    """Collective events from MPI NVTX ranges of one profile's rank processes."""
    if nvtx.is_empty():
        return pl.DataFrame(schema=EVENT_SCHEMA)
    return (
        nvtx.lazy()
        .filter((pl.col("style") != "mark")
                & per_value(nvtx, "name", pl.col("name").str.contains(MPI_COLLECTIVE_RE))
                .fill_null(False))
        .join(rank_rows.lazy().select("pid", "rank", "trace_index"), on="pid")
        .with_columns(pl.col("name").cast(pl.String))  # (the MPI calls: a few per step)
        .select(
            "rank", "trace_index", pl.lit("mpi").alias("kind"), pl.col("name").alias("key"),
            "name", pl.lit(False).alias("p2p"),
            pl.col("start_ns").alias("arrival_local"), pl.col("end_ns").alias("end_local"),
        )
        .collect()
    )


def number(events: pl.DataFrame) -> pl.DataFrame:
    """Add ``seq``: occurrence index of the key on its rank, in arrival order."""
    return events.sort("rank", "key", "arrival_local", "end_local").with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "key").alias("seq")
    )


def _score(diffs: pl.Expr) -> pl.Expr:
    med = diffs.median()
    return med.abs() + (diffs - med).abs().median()


def match(events: pl.DataFrame, max_shift: int = 3, min_pairs: int = 3) -> pl.DataFrame:
    """Give every event ``seq_ref``: the occurrence index on the key's reference rank it
    matches (see the module doc). Events need ``job_end`` (coarse-aligned end time)."""
    if events.is_empty():
        return events.with_columns(pl.lit(None, pl.Int64).alias("seq_ref"))
    ref_rank = events.group_by("key").agg(pl.col("rank").min().alias("_ref"))
    ev = events.join(ref_rank, on="key")
    ref = ev.filter(pl.col("rank") == pl.col("_ref")).select(
        "key", pl.col("seq").alias("_rseq"), pl.col("job_end").alias("_rend")
    )
    others = ev.filter(pl.col("rank") != pl.col("_ref"))
    shifts = pl.DataFrame({"_shift": list(range(-max_shift, max_shift + 1))},
                          schema={"_shift": pl.Int64})
    # Every (rank, key, shift): pair rank seq i + shift with reference seq i; a handful of
    # shifts per rank and key, each a join, not a loop over events.
    pairs = (
        others.select("rank", "key", "seq", "job_end")
        .join(shifts, how="cross")
        .with_columns((pl.col("seq") - pl.col("_shift")).alias("_rseq"))
        .join(ref, on=["key", "_rseq"])
    )
    scored = (
        pairs.group_by("rank", "key", "_shift")
        .agg(_score(pl.col("job_end") - pl.col("_rend")).alias("_score"), pl.len().alias("_n"))
        .filter(pl.col("_n") >= min_pairs)
    )
    zero = scored.filter(pl.col("_shift") == 0).select("rank", "key",
                                                       pl.col("_score").alias("_s0"))
    best = (
        scored.sort("rank", "key", "_score", pl.col("_shift").abs())
        .group_by("rank", "key", maintain_order=True)
        .first()
        .join(zero, on=["rank", "key"], how="left")
        .select(
            "rank", "key",
            pl.when(pl.col("_s0").is_null() | (pl.col("_score") * 2 < pl.col("_s0")))
            .then(pl.col("_shift")).otherwise(0).alias("_use"),
        )
    )
    return (
        ev.join(best, on=["rank", "key"], how="left")
        .with_columns(
            pl.when(pl.col("rank") == pl.col("_ref")).then(pl.col("seq"))
            .otherwise(pl.col("seq") - pl.col("_use").fill_null(0)).alias("seq_ref")
        )
        .drop("_ref", "_use")
    )


@dataclass
class ClockFit:
    """Per profile: ``trace_index, coarse_ns, refine_ns, residual_ns, n_matched``."""

    table: pl.DataFrame
    reference_trace: int
    notes: list[str]

    def offsets(self) -> pl.DataFrame:
        return self.table.select(
            "trace_index", (pl.col("coarse_ns") + pl.col("refine_ns")).alias("offset_ns")
        )

    def summary(self) -> dict[str, Any]:
        res = self.table["residual_ns"].drop_nulls()
        return {
            "clock_reference_trace": self.reference_trace,
            "clock_offsets_ns": dict(zip(self.table["trace_index"].to_list(),
                                         self.offsets()["offset_ns"].to_list(), strict=True)),
            "clock_refine_ns": dict(zip(self.table["trace_index"].to_list(),
                                        self.table["refine_ns"].to_list(), strict=True)),
            "clock_residual_ns": int(res.max()) if res.len() else None,
        }


def coarse_offsets(session_starts: list[int | None]) -> tuple[pl.DataFrame, list[str]]:
    """Shift per profile from its session start (UTC ns) to the job's earliest one."""
    notes = []
    known = [s for s in session_starts if s is not None]
    zero = min(known) if known else 0
    if len(known) < len(session_starts):
        notes.append("some profiles lack a session start time: their clocks are not aligned "
                     "coarsely (offset 0 before refinement)")
    coarse = [s - zero if s is not None else 0 for s in session_starts]
    return pl.DataFrame({"trace_index": list(range(len(coarse))), "coarse_ns": coarse},
                        schema={"trace_index": pl.Int64, "coarse_ns": pl.Int64}), notes


def fit_clocks(matched: pl.DataFrame, coarse: pl.DataFrame, reference_trace: int,
               refine: bool = True, min_matched: int = 3) -> ClockFit:
    """Refine the coarse offsets with matched collective end times (see the module doc)."""
    notes: list[str] = []
    per_trace = coarse.with_columns(
        pl.lit(0, pl.Int64).alias("refine_ns"), pl.lit(None, pl.Int64).alias("residual_ns"),
        pl.lit(0, pl.Int64).alias("n_matched"),
    )
    n_traces = coarse.height
    if not refine or n_traces < 2 or matched.is_empty():
        return ClockFit(per_trace, reference_trace, notes)
    # Prefer collectives: p2p ends are simultaneous only pairwise.
    usable = matched.filter(~pl.col("p2p")) if (~matched["p2p"]).any() else matched
    ref_end = (
        usable.filter(pl.col("trace_index") == reference_trace)
        .group_by("key", "seq_ref").agg(pl.col("job_end").median().alias("_ref_end"))
    )
    diffs = (
        usable.filter(pl.col("trace_index") != reference_trace)
        .join(ref_end, on=["key", "seq_ref"])
        .with_columns((pl.col("job_end") - pl.col("_ref_end")).alias("_d"))
    )
    fit = (
        diffs.group_by("trace_index")
        .agg(pl.col("_d").median().alias("_med"), pl.len().alias("_n"))
    )
    resid = (
        diffs.join(fit, on="trace_index")
        .group_by("trace_index")
        .agg((pl.col("_d") - pl.col("_med")).abs().median().alias("_res"))
    )
    fit = fit.join(resid, on="trace_index")
    table = (
        per_trace.join(fit, on="trace_index", how="left")
        .with_columns(
            pl.when(pl.col("_n") >= min_matched).then(-pl.col("_med").round().cast(pl.Int64))
            .otherwise(0).alias("refine_ns"),
            pl.when(pl.col("_n") >= min_matched).then(pl.col("_res").round().cast(pl.Int64))
            .alias("residual_ns"),
            pl.col("_n").fill_null(0).cast(pl.Int64).alias("n_matched"),
        )
        .with_columns(
            pl.when(pl.col("trace_index") == reference_trace).then(0)
            .otherwise(pl.col("refine_ns")).alias("refine_ns")
        )
        .select("trace_index", "coarse_ns", "refine_ns", "residual_ns", "n_matched")
        .sort("trace_index")
    )
    few = table.filter((pl.col("trace_index") != reference_trace)
                       & (pl.col("n_matched") < min_matched))["trace_index"].to_list()
    if few:
        notes.append(f"profiles {few}: fewer than {min_matched} matched collectives with the "
                     "reference profile; their clocks rely on the session start alone")
    return ClockFit(table, reference_trace, notes)


def instances(matched: pl.DataFrame, job_id: str) -> pl.DataFrame:
    """The COLLECTIVES table from matched events carrying ``arrival_ns, end_ns`` (job time):
    instances present on at least two ranks, numbered by first arrival."""
    if matched.is_empty():
        return schemas.empty(schemas.COLLECTIVES)
    inst = ["key", "seq_ref"]
    df = (
        matched.unique(["rank", *inst], keep="first")
        .with_columns(pl.len().over(inst).alias("_n"))
        .filter(pl.col("_n") >= 2)
    )
    if df.is_empty():
        return schemas.empty(schemas.COLLECTIVES)
    first = pl.col("arrival_ns").min().over(inst)
    last = pl.col("arrival_ns").max().over(inst)
    # The last arriver: latest arrival; ties go to the higher rank, deterministically.
    last_rank = pl.col("rank").sort_by(["arrival_ns", "rank"]).last().over(inst)
    out = (
        df.with_columns(
            (pl.col("arrival_ns") - first).alias("lag_ns"),
            (last - pl.col("arrival_ns")).alias("wait_ns"),
            (last - first).alias("skew_ns"),
            (pl.col("end_ns").max().over(inst) - pl.col("end_ns").min().over(inst))
            .alias("end_spread_ns"),
            last_rank.alias("last_rank"),
            first.alias("_first"),
            (pl.col("end_ns") - pl.col("arrival_ns")).alias("duration_ns"),
        )
        .with_columns(pl.col("wait_ns").sum().over(inst).alias("wait_imposed_ns"))
    )
    order = (
        out.group_by(inst).agg(pl.col("_first").first())
        .sort("_first", *inst)
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("instance"))
        .drop("_first")
    )
    out = (
        out.join(order, on=inst)
        .with_columns(pl.lit(job_id).alias("trace_id"), pl.col("seq_ref").alias("seq"))
        .sort("instance", "rank")
    )
    return schemas.conform(out, schemas.COLLECTIVES)
