"""Multi-rank jobs: rank discovery, matching, clock alignment, stragglers. A synthetic job with a
planted straggler and clock offset, and the H100 (2 processes, 1 file) and gpubootcamp (2 MPI
ranks, 2 files) shared traces."""

from __future__ import annotations

import polars as pl
import pytest

from nsysan.errors import ConfigError
from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.multirank import JobParams, align, analyze_job, job_files, write_job_outputs
from nsysan.multirank.ranks import env_of_meta, rank_from_env, rank_from_path
from nsysan.multirank.synth import StragglerJob, write_straggler_job

MS = 1_000_000


# ---------------------------------------------------------------------------------------------
# Rank evidence
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "rank"), [
    ("rep.3.nsys-rep", 3),  # nsys profile -o rep.%q{OMPI_COMM_WORLD_RANK}
    ("out/rep.12.nsys-rep.nsys2022.4.2.sqlite", 12),
    ("trace_rank7.sqlite", 7),
    ("job_rank0.sqlite", 0),
    ("node01.rank-5.qdrep", 5),
    ("profile_3.sqlite", 3),
    ("Rank_2.parquetdir", 2),
    ("mpi_report1.qdrep.nsys2022.4.2.sqlite", None),  # "report1" is a name, not a rank
    ("4gpu_baseline.nsys-rep", None),
    ("report2.qdrep", None),
])
def test_rank_from_file_name(path, rank):
    assert rank_from_path(path) == rank


@pytest.mark.parametrize(("rows", "want"), [
    ([("capture:PROCESS_0:ENVIRONMENT_VARIABLE", 'RANK="5"')], {"RANK": "5"}),
    ([("system:DeviceEnvironment", "A=1\x00OMPI_COMM_WORLD_RANK=3\x00PATH=/a:/b")],
     {"A": "1", "OMPI_COMM_WORLD_RANK": "3", "PATH": "/a:/b"}),
    ([("system:DeviceEnvironment", "A=x;y;LOCAL_RANK=1;B=2")],  # newer exports: ";"
     {"A": "x;y", "LOCAL_RANK": "1", "B": "2"}),
    ([("env:SLURM_PROCID", "4")], {"SLURM_PROCID": "4"}),
    # the process environment wins over the device (daemon) environment
    ([("system:DeviceEnvironment", "RANK=9"), ("PROCESS_0:ENVIRONMENT_VARIABLE", 'RANK="1"')],
     {"RANK": "1"}),
    ([("system:Hostname", "n1")], {}),
])
def test_env_of_meta(rows, want):
    meta = pl.DataFrame(rows, schema={"key": pl.String, "value": pl.String}, orient="row")
    assert env_of_meta(meta) == want


@pytest.mark.parametrize(("env", "want"), [
    ({"RANK": "2", "OMPI_COMM_WORLD_RANK": "5"}, (2, "env:RANK")),
    # mpirun inside one Slurm task: every rank has SLURM_PROCID=0
    ({"SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "3"}, (3, "env:OMPI_COMM_WORLD_RANK")),
    ({"PMI_RANK": "6", "LOCAL_RANK": "0"}, (6, "env:PMI_RANK")),
    ({"LOCAL_RANK": "1"}, (1, "env:LOCAL_RANK")),
    ({"RANK": "x"}, None),
    ({}, None),
])
def test_rank_from_env_priority(env, want):
    assert rank_from_env(env) == want


# ---------------------------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------------------------
def _events(rank: int, ends: list[int], key: str = "AllReduce@stream0") -> pl.DataFrame:
    return pl.DataFrame({
        "rank": rank, "trace_index": rank, "kind": "nccl", "key": key, "name": "AllReduce",
        "p2p": False, "arrival_local": [e - 100 for e in ends], "end_local": ends,
    }, schema=align.EVENT_SCHEMA).with_columns(pl.col("end_local").alias("job_end"))


def test_match_realigns_a_rank_whose_capture_lost_the_first_occurrences():
    # Irregular spacing so that only one shift makes end times agree.
    ends = [10, 25, 31, 60, 64, 90, 120, 121, 150, 170]
    ends = [e * MS for e in ends]
    ev = align.number(pl.concat([_events(0, ends), _events(1, ends[2:])]))
    m = align.match(ev, max_shift=3, min_pairs=3)
    got = m.filter(pl.col("rank") == 1).sort("seq")
    assert got["seq_ref"].to_list() == list(range(2, 10))
    same = align.match(align.number(pl.concat([_events(0, ends), _events(1, ends)])))
    assert (same["seq_ref"] == same["seq"]).all()


def test_clock_fit_recovers_an_offset_and_reports_the_residual():
    ends = [i * 10 * MS for i in range(1, 21)]
    jitter = [0, 3, -2, 5, -4, 1, 0, 2, -1, -3] * 2
    ev = align.number(pl.concat([
        _events(0, ends),
        _events(1, [e + 777_000 + j for e, j in zip(ends, jitter, strict=True)]),
    ]))
    coarse = pl.DataFrame({"trace_index": [0, 1], "coarse_ns": [0, 0]})
    fit = align.fit_clocks(align.match(ev), coarse, reference_trace=0)
    row = fit.table.filter(pl.col("trace_index") == 1).row(0, named=True)
    assert abs(row["refine_ns"] + 777_000) <= row["residual_ns"]
    assert row["residual_ns"] == 2  # median |jitter - median|
    assert row["n_matched"] == 20


# ---------------------------------------------------------------------------------------------
# The planted job
# ---------------------------------------------------------------------------------------------
PLANTED = [
    StragglerJob(),  # rank 2 slow every 4 steps (phase 1); rank 1's clock +2.5 ms
    StragglerJob(n_ranks=3, n_steps=21, straggler=0, period=3, phase=2, offset_rank=2,
                 clock_error_ns=-4_000_000, slow_ns=15_000_000, seed=3),
]


@pytest.mark.parametrize("planted", PLANTED, ids=["4ranks", "3ranks-neg-offset"])
def test_planted_straggler_and_clock_offset_are_recovered(tmp_path, planted):
    job = write_straggler_job(tmp_path, planted)
    res = analyze_job(tmp_path)  # a job directory
    ranks = res.ranks
    assert ranks.schema == schemas.RANKS and res.collectives.schema == schemas.COLLECTIVES
    assert ranks["rank"].to_list() == list(range(job.n_ranks))
    assert set(ranks["rank_source"]) == {"file_name"}
    assert ranks["source_trace_id"].to_list() == [f"job_rank{r}" for r in range(job.n_ranks)]

    # Clock: relative offsets equal the true session-start gaps within the residual, although
    # the recorded session start of one rank is off by clock_error_ns.
    residual = res.metrics["clock_residual_ns"]
    assert residual is not None and residual < 10_000
    off = dict(ranks.select("rank", "clock_offset_ns").iter_rows())
    for r in range(job.n_ranks):
        truth = job.session_start_true_ns(r) - job.session_start_true_ns(0)
        assert abs(off[r] - off[0] - truth) <= max(residual, 1)
    refine = dict(ranks.select("rank", "clock_refine_ns").iter_rows())
    assert abs(refine[job.offset_rank] + job.clock_error_ns) <= max(residual, 1)

    # Collectives: one AllReduce per step, on every rank.
    coll = res.collectives
    assert coll["instance"].n_unique() == job.n_steps
    assert coll.group_by("instance").len()["len"].unique().to_list() == [job.n_ranks]
    slow = coll.filter(pl.col("skew_ns") > job.slow_ns // 2)
    assert slow["last_rank"].unique().to_list() == [job.straggler]
    assert slow["seq"].unique().sort().to_list() == list(
        range(job.phase, job.n_steps, job.period))

    # The straggler, its period (in steps), phase and cause.
    [finding] = [f for f in res.findings if f.code == "STRAGGLER_RANK"]
    ev = finding.evidence
    assert (ev["rank"], ev["period"], ev["period_unit"], ev["phase"], ev["cause"]) == (
        job.straggler, job.period, "steps", job.phase, "data_loading")
    n_slow = len(range(job.phase, job.n_steps, job.period))
    assert ev["n_last"] == n_slow
    assert ev["cause_excess_ns"] == pytest.approx(n_slow * job.slow_ns, rel=0.02)
    assert ev["cause_ranges"] == ["DataLoader.next"]
    assert finding.layer == "framework" and finding.severity == "warning"
    assert "EXPOSED_COMMUNICATION" in {f.code for f in res.findings}  # the others wait
    last = dict(ranks.select("rank", "n_last").iter_rows())
    assert last[job.straggler] == n_slow and sum(last.values()) == n_slow
    # Per-rank metrics: steps from the train_step ranges, busy share, exposed NCCL.
    assert ranks["n_steps"].to_list() == [job.n_steps] * job.n_ranks
    assert ranks["busy_frac"].is_between(0, 1).all()
    assert (ranks["exposed_comm_ns"] > 0).all()
    assert ranks["first_kernel_ns"].null_count() == 0


def test_startup_skew(tmp_path):
    write_straggler_job(tmp_path, StragglerJob(
        n_ranks=3, n_steps=6, straggler=-1, late_start_rank=1, late_start_ns=300 * MS))
    res = analyze_job(tmp_path, params=JobParams(startup_skew_ns=100 * MS))
    [f] = [f for f in res.findings if f.code == "RANK_STARTUP_SKEW"]
    assert f.evidence["latest_rank"] == 1 and f.evidence["what"] == "first collective"
    assert f.evidence["skew_ns"] == pytest.approx(300 * MS, rel=0.01)
    assert not [f for f in res.findings if f.code == "STRAGGLER_RANK"]  # late only once
    first = dict(res.ranks.select("rank", "first_kernel_ns").iter_rows())
    assert first[1] - first[0] == pytest.approx(300 * MS, rel=0.01)
    quiet = analyze_job(tmp_path)  # default threshold 500 ms
    assert "RANK_STARTUP_SKEW" not in {f.code for f in quiet.findings}


def test_write_job_outputs(tmp_path):
    job = write_straggler_job(tmp_path / "in", StragglerJob(n_ranks=2, n_steps=8, straggler=1,
                                                            period=2, phase=0))
    res = analyze_job(job.paths, job_id="planted")
    out = write_job_outputs(res, tmp_path / "out")
    ranks = pl.read_parquet(out / "ranks.parquet")
    coll = pl.read_parquet(out / "collectives.parquet")
    assert ranks.schema == schemas.RANKS and coll.schema == schemas.COLLECTIVES
    assert ranks["trace_id"].unique().to_list() == ["planted"]
    md = (out / "job_findings.md").read_text()
    assert md.startswith("# Job planted") and "STRAGGLER_RANK" in md and "| 1 |" in md


def test_explicit_rank_map_and_duplicate_evidence(tmp_path):
    job = write_straggler_job(tmp_path, StragglerJob(n_ranks=2, n_steps=6))
    res = analyze_job(job.paths, rank_map={str(job.paths[0]): 5, "job_rank1": 9})
    assert dict(res.ranks.select("source_trace_id", "rank").iter_rows()) == {
        "job_rank0": 5, "job_rank1": 9}
    assert set(res.ranks["rank_source"]) == {"explicit"}
    dup = analyze_job(job.paths, rank_map={"job_rank0": 1, "job_rank1": 1})
    assert dup.ranks["rank"].to_list() == [0, 1]
    assert dup.ranks["rank_source"][0].startswith("input_order (duplicate ranks")


def test_bad_inputs(tmp_path):
    with pytest.raises(ConfigError):
        JobParams(straggler_share=0)
    with pytest.raises(ConfigError):
        JobParams(data_pattern="(")
    with pytest.raises(ConfigError):
        analyze_job(tmp_path)  # empty job directory


# ---------------------------------------------------------------------------------------------
# Shared traces
# ---------------------------------------------------------------------------------------------
H100 = "nsysai-h100-2gpu/mfu_2gpu_before.sqlite"
BOOTCAMP = "gpubootcamp-jacobi-multigpu"


@pytest.mark.shared
def test_h100_one_file_two_processes_are_two_ranks(shared_traces):
    res = analyze_job(shared_traces / H100)
    r = res.ranks
    assert r.select("rank", "pid", "device_id").rows() == [(0, 144, 0), (1, 145, 1)]
    assert set(r["rank_source"]) == {"process_order:device_id"}
    assert r["clock_offset_ns"].to_list() == [0, 0]  # one file, one clock
    for col in ("first_kernel_ns", "first_collective_ns", "step_time_ns", "busy_frac",
                "comm_ns", "exposed_comm_ns", "n_steps"):
        assert r[col].null_count() == 0, col
    assert (r["comm_ns"] > 0).all() and r["busy_frac"].is_between(0.5, 1).all()
    # Their SendRecv operations, listed per rank and matched pairwise.
    assert dict(res.nccl.group_by("pid").agg(pl.col("op").unique().first()).iter_rows()) == {
        144: "SendRecv", 145: "SendRecv"}
    coll = res.collectives
    assert coll["instance"].n_unique() == 33 and set(coll["name"]) == {"SendRecv"}
    assert coll.group_by("instance").len()["len"].unique().to_list() == [2]
    assert (coll["skew_ns"] >= 0).all() and (coll["wait_ns"] <= coll["skew_ns"]).all()
    # Swapping the ranks explicitly.
    swapped = analyze_job(shared_traces / H100,
                          rank_map={("mfu_2gpu_before", 144): 1, ("mfu_2gpu_before", 145): 0})
    assert swapped.ranks.select("rank", "pid").rows() == [(0, 145), (1, 144)]


@pytest.mark.shared
def test_gpubootcamp_mpi_reports_as_one_job(shared_traces):
    directory = shared_traces / BOOTCAMP
    assert [p.name for p in job_files(directory)] == [
        "mpi_report1.qdrep.nsys2022.4.2.sqlite", "mpi_report2.qdrep.nsys2022.4.2.sqlite"]
    res = analyze_job(directory)
    r = res.ranks
    assert r["rank"].to_list() == [3, 7]
    assert r["source_trace_id"].to_list() == ["mpi_report1", "mpi_report2"]
    assert set(r["rank_source"]) <= {"env:OMPI_COMM_WORLD_RANK", "thread_name"}
    allred = res.collectives.filter(pl.col("name") == "MPI_Allreduce")
    assert allred["instance"].n_unique() == 1001  # every MPI_Allreduce range, both files
    assert allred.group_by("instance").agg(pl.col("rank").sort())["rank"].to_list() == \
        [[3, 7]] * 1001
    # The skew of every instance: the spread of its arrivals, the same on both rows.
    per = allred.group_by("instance").agg(
        pl.col("skew_ns").n_unique().alias("n"), pl.col("skew_ns").first().alias("skew"),
        (pl.col("arrival_ns").max() - pl.col("arrival_ns").min()).alias("spread"),
        pl.col("wait_ns").max().alias("wait"),
    )
    assert (per["n"] == 1).all() and (per["skew"] == per["spread"]).all()
    assert (per["wait"] == per["skew"]).all() and per["skew"].median() > 0
    # Clocks: the session starts differ by 2781 ns; ends then agree to within a microsecond.
    assert res.metrics["clock_residual_ns"] < 1_000
    assert res.metrics["median_end_spread_ns"] < 1_000
    assert r["clock_offset_ns"][0] == 0 and abs(r["clock_offset_ns"][1] - 2_781) < 1_000


@pytest.mark.shared
def test_gpubootcamp_ranks_from_thread_names_without_environment(shared_traces):
    """Without the capture environment, Nsight Systems' `MPI Rank N` thread name says it."""
    from nsysan.load import open_trace

    traces = []
    for path in job_files(shared_traces / BOOTCAMP):
        t = open_trace(path)
        frames = {n: t.frame(n) for n in schemas.CANONICAL if t.has(n) or n == "meta"}
        frames["meta"] = frames["meta"].filter(~pl.col("key").str.contains("Environment"))
        traces.append(Trace.from_frames(t.trace_id, frames,
                                        session_start_utc_ns=t.meta.session_start_utc_ns))
    res = analyze_job(traces)
    assert res.ranks.select("rank", "rank_source").rows() == [(3, "thread_name"),
                                                              (7, "thread_name")]


def test_a_job_holds_one_profile_at_a_time(tmp_path, monkeypatch):
    """Each profile's frames are released before the next one is read (a job's memory is
    that of its largest profile), and the results equal those of a job whose profiles keep
    every frame."""
    job = write_straggler_job(tmp_path, StragglerJob())
    held: list[int] = []
    original = Trace.release

    def spy(self, names=None):
        held.append(sum(other._frames != {} for other in opened))
        original(self, names)

    from nsysan.load import open_trace

    opened = [open_trace(p, frame_cache=False) for p in job.paths]
    monkeypatch.setattr(Trace, "release", spy)
    res = analyze_job(opened)
    assert held == [1] * len(job.paths)  # only the profile being released holds frames
    assert all(not t._frames for t in res.traces)
    monkeypatch.setattr(Trace, "release", lambda self, names=None: None)
    kept = analyze_job([open_trace(p, frame_cache=False) for p in job.paths])
    assert res.ranks.equals(kept.ranks) and res.collectives.equals(kept.collectives)
    assert [f.message for f in res.findings] == [f.message for f in kept.findings]
