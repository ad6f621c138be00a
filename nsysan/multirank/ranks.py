"""Which process of which profile is which rank.

A *rank* is one process that did GPU work (or, in CPU-only MPI profiles, one process with MPI
NVTX ranges). Evidence, strongest first:

1. an explicit ``rank_map`` (``{path or trace_id: rank}`` or ``{(trace_id, pid): rank}``);
2. for a profile with a single rank process, the launch environment recorded in the capture
   metadata: ``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ``PMIX_RANK``,
   ``MV2_COMM_WORLD_RANK``, ``SLURM_PROCID``, ``LOCAL_RANK`` (first found). ``SLURM_PROCID``
   comes after the MPI variables because ``mpirun`` inside one Slurm task gives every rank
   ``SLURM_PROCID=0``;
3. the thread name Nsight Systems gives MPI ranks (``MPI Rank 3``);
4. NCCL's communicator-init NVTX payload (``Rank``);
5. the file name: ``rank3``, ``rank_3``, ``..._3.nsys-rep``, ``....3.sqlite`` (what ``%q{RANK}``
   expands to); a bare trailing number glued to a word (``report1``) is not a rank;
6. within one profile with several rank processes: the order of the devices they use (one
   device each), else of their pids; across profiles, the order they were given in.

Ranks must be unique: when the chosen evidence collides (two files that both say
``LOCAL_RANK=0``), every rank is re-numbered by order and the reason is kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from nsysan.frames.text import per_value
from nsysan.frames.trace import Trace
from nsysan.load.environment import RANK_VARS as RANK_VARS  # re-exported: they lived here
from nsysan.load.environment import WORLD_SIZE_VARS as WORLD_SIZE_VARS
from nsysan.load.environment import env_of_meta as env_of_meta
from nsysan.load.environment import env_of_trace, rank_from_env
from nsysan.load.environment import world_size_from_env as world_size_from_env

_THREAD_RANK_RE = r"(?i)^MPI Rank (\d+)$"
_PAYLOAD_RANK_RE = r'"Rank"\s*:\s*"?(\d+)'
_COMM_INIT_RE = r"^ncclComm(?:InitRank|InitAll|InitRankConfig|InitRankScalable|Split)"
_FILE_RANK_RES = (
    re.compile(r"(?i)(?:^|[^a-z])rank[_\-.=]?(\d+)(?:$|[^0-9])"),
    re.compile(r"[._\-](\d+)$"),
)
_REPORT_SUFFIX_RE = re.compile(
    r"(?i)(\.nsys\d{4}(?:\.\d+)*)?\.(sqlite|nsys-rep|qdrep|parquetdir|arrowdir)$"
)
MPI_OR_NCCL_API_RE = r"^(MPI_|nccl)"


def hostname_of(trace: Trace, env: Mapping[str, str]) -> str | None:
    meta = trace.frame("meta")
    if not meta.is_empty():
        hit = meta.filter(pl.col("key").str.contains(r"(?i)(^|[:.])hostname$"))
        if not hit.is_empty():
            return hit["value"][0]
    return env.get("HOSTNAME") or env.get("SLURMD_NODENAME") or None


def rank_from_path(path: str | Path) -> int | None:
    """The rank a report's file name states (``rep.3.nsys-rep``, ``trace_rank12.sqlite``)."""
    stem = Path(path).name
    while True:
        new = _REPORT_SUFFIX_RE.sub("", stem)
        if new == stem:
            break
        stem = new
    for rx in _FILE_RANK_RES:
        m = rx.search(stem)
        if m:
            return int(m.group(1))
    return None


def rank_processes(trace: Trace) -> pl.DataFrame:
    """``pid, global_pid, device_id`` of the processes that act as ranks in one profile
    (device_id = the device it kept busiest; null for CPU-only ranks)."""
    ops = trace.frame("gpu_ops")
    if not ops.is_empty():
        per = (
            ops.group_by("pid", "global_pid", "device_id")
            .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("_t"))
            .sort(["pid", "_t", "device_id"], descending=[False, True, False])
            .group_by("pid", maintain_order=True)
            .agg(pl.col("global_pid").first(), pl.col("device_id").first(),
                 pl.col("device_id").n_unique().alias("_n_dev"))
        )
        return per.sort("pid").select("pid", "global_pid", "device_id", "_n_dev")
    nvtx = trace.frame("nvtx")
    # (inside a select: a filter of the whole frame would expand its constant columns)
    cpu = nvtx.select(pl.col("pid", "global_pid").filter(
        per_value(nvtx, "name", pl.col("name").str.contains(MPI_OR_NCCL_API_RE))
        .fill_null(False)))
    if cpu.is_empty():
        cpu = trace.frame("cuda_api")
    return (
        cpu.group_by("pid").agg(pl.col("global_pid").first())
        .with_columns(pl.lit(None, pl.Int64).alias("device_id"),
                      pl.lit(0, pl.UInt32).alias("_n_dev"))
        .sort("pid")
        .select("pid", "global_pid", "device_id", "_n_dev")
    )


def _per_process_evidence(trace: Trace, procs: pl.DataFrame) -> pl.DataFrame:
    """``pid, thread_rank, payload_rank`` from thread names and NCCL init payloads."""
    threads = trace.frame("threads")
    thread_rank = (
        threads.lazy()
        .select("pid", pl.col("name").str.extract(_THREAD_RANK_RE, 1).cast(pl.Int64).alias("r"))
        .drop_nulls()
        .group_by("pid")
        .agg(pl.col("r").min().alias("thread_rank"))
    )
    nvtx = trace.frame("nvtx")
    payload_rank = (
        nvtx.lazy()
        .filter(per_value(nvtx, "name", pl.col("name").str.contains(_COMM_INIT_RE))
                .fill_null(False))
        .select("pid", pl.col("payload_json").str.extract(_PAYLOAD_RANK_RE, 1).cast(pl.Int64)
                .alias("r"))
        .drop_nulls()
        # The first communicator a process creates is normally the world one.
        .group_by("pid", maintain_order=True)
        .agg(pl.col("r").first().alias("payload_rank"))
    )
    return (
        procs.lazy().select("pid")
        .join(thread_rank, on="pid", how="left")
        .join(payload_rank, on="pid", how="left")
        .collect()
    )


def _explicit(rank_map: Mapping[Any, int] | None, trace: Trace, pid: int, n_procs: int
              ) -> int | None:
    if not rank_map:
        return None
    for key in ((trace.trace_id, pid), (str(trace.meta.path), pid)):
        if key in rank_map:
            return int(rank_map[key])
    if n_procs == 1:
        for key in (trace.trace_id, str(trace.meta.path), Path(trace.meta.path).name):
            if key in rank_map:
                return int(rank_map[key])
    return None


#: columns of `rank_candidates` / `assign_ranks`
RANK_SCHEMA = {"trace_index": pl.Int64, "trace_id": pl.String, "pid": pl.Int64,
               "global_pid": pl.Int64, "device_id": pl.Int64, "rank": pl.Int64,
               "rank_source": pl.String, "hostname": pl.String}


def rank_candidates(t_index: int, trace: Trace, rank_map: Mapping[Any, int] | None = None
                    ) -> pl.DataFrame:
    """The rank processes of one profile with the rank its own evidence gives them (null
    where it gives none), before the job-wide numbering (`assign_ranks`).
    Reads only this profile, so a job can go through its profiles one at a time."""
    rows: list[dict[str, Any]] = []
    procs = rank_processes(trace)
    env = env_of_trace(trace)
    host = hostname_of(trace, env)
    evidence = _per_process_evidence(trace, procs)
    distinct_devices = (
        procs["device_id"].null_count() == 0
        and procs["device_id"].n_unique() == procs.height
        and bool((procs["_n_dev"] == 1).all())
    )
    order_col = "device_id" if distinct_devices else "pid"
    order = procs.sort(order_col)["pid"].to_list()
    # one iteration per rank process: a handful, never per event
    for proc, ev in zip(procs.iter_rows(named=True), evidence.iter_rows(named=True),
                        strict=True):
        pid = proc["pid"]
        found: tuple[int, str] | None = None
        explicit = _explicit(rank_map, trace, pid, procs.height)
        if explicit is not None:
            found = (explicit, "explicit")
        if found is None and procs.height == 1:
            found = rank_from_env(env)
        if found is None and ev["thread_rank"] is not None:
            found = (ev["thread_rank"], "thread_name")
        if found is None and ev["payload_rank"] is not None:
            found = (ev["payload_rank"], "nccl_payload")
        if found is None and procs.height == 1:
            r = rank_from_path(trace.meta.path)
            if r is not None:
                found = (r, "file_name")
        if found is None and procs.height > 1:
            found = (order.index(pid), f"process_order:{order_col}")
        rows.append({
            "trace_index": t_index, "trace_id": trace.trace_id, "pid": pid,
            "global_pid": proc["global_pid"], "device_id": proc["device_id"],
            "rank": found[0] if found else None,
            "rank_source": found[1] if found else "input_order",
            "hostname": host,
        })
    return pl.DataFrame(rows, schema=RANK_SCHEMA, orient="row")


def assign_ranks(candidates: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """The job's ranks from every profile's `rank_candidates` (in input order): profiles
    without evidence after every known rank; every rank re-numbered by order when the
    evidence collides. Sorted by rank."""
    df = pl.concat([pl.DataFrame(schema=RANK_SCHEMA), *candidates])
    if df.is_empty():
        return df
    # Profiles without evidence are placed after every known rank, in input order.
    known = df["rank"].drop_nulls()
    base = int(known.max()) + 1 if known.len() else 0
    df = df.with_columns(
        pl.coalesce("rank", base + pl.int_range(pl.len()).cast(pl.Int64)
                    - pl.col("rank").is_not_null().cast(pl.Int64).cum_sum()).alias("rank")
    )
    if df["rank"].n_unique() != df.height:
        dup = df.filter(pl.col("rank").is_duplicated())["rank_source"].unique().sort().to_list()
        df = df.with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("rank"),
            (pl.lit("input_order (duplicate ranks from ") + pl.lit(", ".join(dup)) + pl.lit(")"))
            .alias("rank_source"),
        )
    return df.sort("rank")
