"""The nccl pass: name parsing, nccl-tests bandwidth formulas, exposed time against brute force
and the overlap pass, NVTX attribution of grouped ops, and the sc22 / H100 shared traces."""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.errors import ConfigError
from nsysan.frames import intervals as iv
from nsysan.frames import schemas
from nsysan.frames.trace import Trace
from nsysan.passes import nccl, overlap
from nsysan.passes.base import PassResult

US = 1_000
MS = 1_000_000
MIB = 1 << 20
TID = 11


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------
KERNEL_NAMES = [
    # name, op, algorithm, protocol, redop, dtype
    ("ncclKernel_AllReduce_RING_LL_Sum_float", "AllReduce", "RING", "LL", "Sum", "float"),
    ("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_bf16", "ReduceScatter", "RING", "SIMPLE", "Sum",
     "bf16"),
    ("ncclKernel_AllGather_RING_LL128_Sum_int8_t", "AllGather", "RING", "LL128", "Sum",
     "int8_t"),
    ("ncclKernel_Broadcast_TREE_LL_Sum_int8_t", "Broadcast", "TREE", "LL", "Sum", "int8_t"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "SendRecv", "RING", "SIMPLE", "Sum",
     "int8_t"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "AllGather", "RING",
     "LL", None, None),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "SendRecv", None, None, None,
     None),
    ("ncclDevKernel_SendRecv", "SendRecv", None, None, None, None),
    ("ncclDevKernel_Generic_4", "Generic", None, None, None, None),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "AllReduce", "RING", "LL", "Sum", "f32"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_NVLS_SIMPLE", "ReduceScatter", "NVLS", "SIMPLE",
     "Sum", "bf16"),
    ("ncclDevKernel_Reduce_Max_u8_RING_LL", "Reduce", "RING", "LL", "Max", "u8"),
    ("void ncclDevKernel_AllReduce_Sum_f16_TREE_LL128(ncclDevKernelArgsStorage<4096ul>)",
     "AllReduce", "TREE", "LL128", "Sum", "f16"),
    ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "AllReduce", "RING", "LL", "Sum", "f32"),
    ("ncclBroadcastTreeKernel_copy_i8", "Broadcast", "TREE", "SIMPLE", None, None),
    ("sm80_xmma_gemm_f16f16_f16f32", None, None, None, None, None),
    ("elementwise_kernel", None, None, None, None, None),
]


@pytest.mark.parametrize(("name", "op", "algo", "proto", "redop", "dtype"), KERNEL_NAMES,
                         ids=[k[0][:48] for k in KERNEL_NAMES])
def test_kernel_name_parsing(name, op, algo, proto, redop, dtype):
    got = nccl.parse_kernel_names([name]).row(0, named=True)
    assert (got["op"], got["algorithm"], got["protocol"], got["redop"], got["dtype"]) == (
        op, algo, proto, redop, dtype)


@pytest.mark.parametrize(("name", "op"), [
    ("ncclAllReduce", "AllReduce"), ("ncclAllGather", "AllGather"),
    ("ncclReduceScatter", "ReduceScatter"), ("ncclBroadcast", "Broadcast"),
    ("ncclBcast", "Broadcast"), ("ncclReduce", "Reduce"), ("ncclSend", "Send"),
    ("ncclRecv", "Recv"), ("ncclAlltoAll", "AllToAll"), ("ncclGroupEnd", None),
    ("ncclGroupStart", None), ("ncclCommInitRank", None), ("ncclAllReduceX", None),
    ("MPI_Allreduce", None),
])
def test_api_range_names(name, op):
    got = pl.DataFrame({"name": [name]}).select(nccl.api_op())["name"][0]
    assert got == op


# nccl-tests conventions (doc/PERFORMANCE.md): busbw = algbw x factor
BUSBW = [
    ("AllReduce", 8, 2 * 7 / 8), ("AllReduce", 2, 1.0), ("AllReduce", 1, 0.0),
    ("AllGather", 4, 3 / 4), ("ReduceScatter", 4, 3 / 4), ("AllToAll", 8, 7 / 8),
    ("Broadcast", 8, 1.0), ("Reduce", 8, 1.0), ("SendRecv", 2, 1.0), ("Send", 2, 1.0),
    ("Recv", 2, 1.0), ("AllReduce", None, None), ("Broadcast", None, 1.0),
]


@pytest.mark.parametrize(("op", "n", "factor"), BUSBW)
def test_busbw_factor(op, n, factor):
    got = nccl.busbw_factor(op, n)
    assert got == pytest.approx(factor) if factor is not None else got is None
    # The vectorised form used by the pass agrees with the scalar one.
    expr = pl.DataFrame({"op": [op], "n": [n]}, schema={"op": pl.String, "n": pl.Int64}).select(
        nccl._busbw_factor_expr(pl.col("op"), pl.col("n")))[0, 0]
    assert expr == pytest.approx(factor) if factor is not None else expr is None


@pytest.mark.parametrize(("op", "nbytes", "n", "dur", "algbw", "busbw"), [
    # AllReduce of 1 GB in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s
    ("AllReduce", 10**9, 8, 10 * MS, 100.0, 175.0),
    # AllGather: NCCL's NVTX size is per rank, nccl-tests' size is n times it
    ("AllGather", 10**9, 4, 10 * MS, 400.0, 300.0),
    ("ReduceScatter", 10**9, 4, 10 * MS, 400.0, 300.0),
    ("SendRecv", 10**8, 2, MS, 100.0, 100.0),
    ("Broadcast", 10**8, 8, MS, 100.0, 100.0),
])
def test_bandwidth_columns(op, nbytes, n, dur, algbw, busbw):
    trace = build(ops=[{"s": 10 * US, "e": 10 * US + dur, "cls": "nccl",
                        "name": "ncclDevKernel_Generic_1"}],
                  nvtx=[{"s": 0, "e": 1, "name": f"nccl{op if op != 'SendRecv' else 'Send'}",
                         "payload": f'{{"Message size [bytes]": {nbytes}}}'}])
    row = run(trace, nccl.NcclParams(n_ranks=n)).tables["nccl"].row(0, named=True)
    if op == "SendRecv":  # a lone ncclSend is a Send
        assert row["op"] == "Send"
    else:
        assert row["op"] == op
    assert row["bytes"] == nbytes
    assert row["algbw_gbps"] == pytest.approx(algbw)
    assert row["busbw_gbps"] == pytest.approx(busbw)


# ---------------------------------------------------------------------------------------------
# Tiny traces
# ---------------------------------------------------------------------------------------------
def build(ops=(), nvtx=(), gpus=("NVIDIA A100-SXM4-80GB",), meta=None) -> Trace:
    """Ops ``{s, e, dev=0, pid=1, stream=7, cls=compute, name=k, api_s=s-2us, tid}``, each
    launched by a 1 us cudaLaunchKernel on thread ``tid``; NVTX ranges ``{s, e, name, pid,
    tid, payload}`` (push/pop)."""
    op_rows, api_rows = [], []
    for i, o in enumerate(ops):
        o = {"dev": 0, "pid": 1, "stream": 7, "cls": "compute", "name": "k", "tid": TID, **o}
        corr = 100 + i
        op_rows.append({
            "kind": "kernel", "start_ns": o["s"], "end_ns": o["e"], "global_pid": o["pid"] << 24,
            "pid": o["pid"], "device_id": o["dev"], "context_id": 1, "stream_id": o["stream"],
            "correlation_id": corr, "name": o["name"], "demangled_name": o["name"],
            "op_class": o["cls"],
        })
        api_s = o.get("api_s", o["s"] - 2 * US)
        api_rows.append({
            "start_ns": api_s, "end_ns": api_s + US, "global_tid": (o["pid"] << 24) | o["tid"],
            "global_pid": o["pid"] << 24, "pid": o["pid"], "tid": o["tid"],
            "correlation_id": corr, "name": "cudaLaunchKernel", "api_class": "launch",
        })
    nv_rows = [{
        "range_id": i, "start_ns": n["s"], "end_ns": n["e"], "pid": n.get("pid", 1),
        "tid": n.get("tid", TID), "global_pid": n.get("pid", 1) << 24,
        "global_tid": (n.get("pid", 1) << 24) | n.get("tid", TID), "domain": "NCCL",
        "name": n["name"], "style": "push_pop", "payload_json": n.get("payload"),
    } for i, n in enumerate(nvtx)]
    frames = {
        "gpu_ops": pl.DataFrame(op_rows, schema=schemas.GPU_OPS, strict=False)
        if op_rows else schemas.empty(schemas.GPU_OPS),
        "cuda_api": pl.DataFrame(api_rows, schema=schemas.CUDA_API, strict=False)
        if api_rows else schemas.empty(schemas.CUDA_API),
        "nvtx": pl.DataFrame(nv_rows, schema=schemas.NVTX, strict=False)
        if nv_rows else schemas.empty(schemas.NVTX),
        "gpus": pl.DataFrame({"device_id": list(range(len(gpus))), "name": list(gpus)}),
        "meta": pl.DataFrame(meta or [], schema={"key": pl.String, "value": pl.String},
                             orient="row"),
    }
    return Trace.from_frames("t", frames)


def run(trace: Trace, params: nccl.NcclParams | None = None, results=None) -> PassResult:
    res = nccl.run(trace, params or nccl.NcclParams(), results or {})
    assert res.tables["nccl"].schema == schemas.NCCL
    assert res.tables["nccl_summary"].schema == schemas.NCCL_SUMMARY
    return res


def test_no_nccl_gives_empty_tables():
    res = run(build(ops=[{"s": 0, "e": 10}]))
    assert res.tables["nccl"].is_empty() and res.tables["nccl_summary"].is_empty()
    assert res.findings == [] and res.metrics["n_ops"] == 0


def test_exposed_time_is_the_part_without_compute_on_the_same_device():
    ops = [
        {"s": 1, "e": 10 * US, "cls": "compute"},  # start 0 would mean "unknown" to CUPTI
        {"s": 20 * US, "e": 30 * US, "cls": "compute", "stream": 8},
        {"s": 5 * US, "e": 25 * US, "cls": "nccl", "stream": 20,
         "name": "ncclKernel_AllReduce_RING_LL_Sum_float"},  # covered 5 + 5
        {"s": 40 * US, "e": 50 * US, "cls": "nccl", "stream": 20,
         "name": "ncclKernel_AllReduce_RING_LL_Sum_float"},  # fully exposed
        {"s": 40 * US, "e": 50 * US, "cls": "compute", "dev": 1},  # other device: no cover
        {"s": 45 * US, "e": 48 * US, "cls": "memcpy_h2d"},  # not compute: no cover
    ]
    t = run(build(ops=ops)).tables["nccl"].sort("start_ns")
    assert t["exposed_ns"].to_list() == [10 * US, 10 * US]
    assert t["seq"].to_list() == [0, 1]
    assert t["op"].to_list() == ["AllReduce", "AllReduce"]
    assert t["op_source"].to_list() == ["kernel", "kernel"]
    assert t["api_name"].to_list() == ["cudaLaunchKernel"] * 2


def test_grouped_send_recv_is_one_sendrecv_with_the_sent_bytes():
    # ncclGroupStart; ncclSend x2; ncclRecv x2; ncclGroupEnd launches one kernel.
    size = '{{"NCCL communicator ID": 77, "Message size [bytes]": {}, "Peer rank": 1}}'
    nvtx = [
        {"s": 100, "e": 200, "name": "ncclSend", "payload": size.format(MIB)},
        {"s": 300, "e": 400, "name": "ncclSend", "payload": size.format(2 * MIB)},
        {"s": 500, "e": 600, "name": "ncclRecv", "payload": size.format(3 * MIB)},
        {"s": 700, "e": 800, "name": "ncclRecv", "payload": size.format(3 * MIB)},
        {"s": 900, "e": 5_000, "name": "ncclGroupEnd"},
        # the next op's ranges belong to the next launch, not to this one
        {"s": 20_000, "e": 20_100, "name": "ncclAllGather", "payload": size.format(MIB)},
    ]
    ops = [
        {"s": 10_000, "e": 11_000, "cls": "nccl", "name": "ncclDevKernel_SendRecv",
         "api_s": 1_000},
        {"s": 30_000, "e": 31_000, "cls": "nccl", "name": "ncclDevKernel_Generic_1",
         "api_s": 21_000},
        # launched by another thread: the ranges above cannot have issued it
        {"s": 40_000, "e": 41_000, "cls": "nccl", "name": "ncclDevKernel_Generic_1",
         "api_s": 500, "tid": 99},
    ]
    t = run(build(ops=ops, nvtx=nvtx), nccl.NcclParams(n_ranks=2)).tables["nccl"]
    t = t.sort("start_ns")
    assert t["op"].to_list() == ["SendRecv", "AllGather", "Generic"]
    assert t["op_source"].to_list() == ["nvtx", "nvtx", "kernel"]
    assert t["nvtx_range"].to_list() == ["ncclRecv+ncclSend", "ncclAllGather", None]
    assert t["bytes"].to_list() == [3 * MIB, MIB, None]
    assert t["comm_id"].to_list() == ["77", "77", None]
    assert t["algbw_gbps"][0] == pytest.approx(3 * MIB / 1_000)
    assert t["busbw_gbps"][1] == pytest.approx(2 * MIB / 1_000 * 0.5)  # AllGather, n = 2


def test_n_ranks_from_payload_env_and_process_count():
    kern = {"s": 10 * US, "e": 20 * US, "cls": "nccl", "name": "ncclDevKernel_AllReduce_Sum_f32"}
    init = {"s": 0, "e": 1, "name": "ncclCommInitRank",
            "payload": '{"NCCL communicator ID": 5, "No. of ranks": 16, "Rank": 3}'}
    assert run(build(ops=[kern], nvtx=[init])).tables["nccl"]["n_ranks"][0] == 16
    env = [("system:DeviceEnvironment", "A=1\x00WORLD_SIZE=8\x00B=2")]
    assert run(build(ops=[kern], meta=env)).tables["nccl"]["n_ranks"][0] == 8
    two = [kern, {**kern, "pid": 2}]
    assert run(build(ops=two)).tables["nccl"]["n_ranks"].to_list() == [2, 2]
    assert run(build(ops=[kern])).tables["nccl"]["n_ranks"][0] is None
    # an explicit parameter wins over everything
    assert run(build(ops=[kern], nvtx=[init]), nccl.NcclParams(n_ranks=4)) \
        .tables["nccl"]["n_ranks"][0] == 4


def test_summary_buckets_by_op_and_size():
    name = "ncclKernel_AllReduce_RING_LL_Sum_float"
    sizes = [1_000, 2 * MIB, 3 * MIB, None]
    ops, nvtx = [], []
    for i, size in enumerate(sizes):
        s = i * MS
        ops.append({"s": s + 100 * US, "e": s + 200 * US, "cls": "nccl", "name": name,
                    "api_s": s + 10 * US})
        payload = None if size is None else f'{{"Message size [bytes]": {size}}}'
        nvtx.append({"s": s, "e": s + 5 * US, "name": "ncclAllReduce", "payload": payload})
    summ = run(build(ops=ops, nvtx=nvtx), nccl.NcclParams(n_ranks=2)).tables["nccl_summary"]
    got = {r["size_bucket"]: (r["n_ops"], r["total_bytes"], r["bucket_min_bytes"])
           for r in summ.iter_rows(named=True)}
    assert got == {"<64KiB": (1, 1_000, 0), "1MiB-16MiB": (2, 5 * MIB, MIB),
                   "unknown": (1, None, None)}
    assert set(summ["op"]) == {"AllReduce"}
    assert summ["exposed_frac"].to_list() == [1.0, 1.0, 1.0]


def test_findings_exposed_and_low_bandwidth():
    name = "ncclKernel_AllReduce_RING_LL_Sum_float"
    # 4 ms of exposed AllReduce in a 10 ms span; 64 MiB in 4 ms on 8 ranks: busbw ~29 GB/s,
    # below a quarter of the A100's nominal 300 GB/s.
    ops = [{"s": 1, "e": 6 * MS}, {"s": 6 * MS, "e": 10 * MS, "cls": "nccl", "name": name,
                                   "stream": 20}]
    nvtx = [{"s": 6 * MS - 10 * US, "e": 6 * MS - 9 * US, "name": "ncclAllReduce",
             "payload": f'{{"Message size [bytes]": {64 * MIB}}}'}]
    res = run(build(ops=ops, nvtx=nvtx), nccl.NcclParams(n_ranks=8))
    codes = {f.code: f for f in res.findings}
    assert codes["EXPOSED_COMMUNICATION"].severity == "critical"  # 40% >= 25%
    assert codes["EXPOSED_COMMUNICATION"].evidence["exposed_ns"] == 4 * MS
    low = codes["NCCL_LOW_BANDWIDTH"]
    assert low.evidence["link_gbps"] == 300.0
    assert low.evidence["median_busbw_gbps"] == pytest.approx(64 * MIB / (4 * MS) * 1.75)
    # With a slow link declared, the same bandwidth is fine.
    res = run(build(ops=ops, nvtx=nvtx), nccl.NcclParams(n_ranks=8, link_gbps=50.0))
    assert "NCCL_LOW_BANDWIDTH" not in {f.code for f in res.findings}
    # Below the exposure threshold: no finding.
    res = run(build(ops=ops, nvtx=nvtx), nccl.NcclParams(n_ranks=8, exposed_warn_frac=0.5,
                                                         exposed_critical_frac=0.6))
    assert "EXPOSED_COMMUNICATION" not in {f.code for f in res.findings}


def test_steps_are_attached_when_the_steps_pass_ran():
    name = "ncclKernel_AllReduce_RING_LL_Sum_float"
    ops = [{"s": 5 * US, "e": 6 * US, "cls": "nccl", "name": name},
           {"s": 15 * US, "e": 16 * US, "cls": "nccl", "name": name},
           {"s": 35 * US, "e": 36 * US, "cls": "nccl", "name": name}]
    steps = pl.DataFrame({"step": [0, 1], "start_ns": [0, 10 * US], "end_ns": [10 * US, 20 * US]})
    res = run(build(ops=ops), results={"steps": PassResult(tables={"steps": steps})})
    assert res.tables["nccl"].sort("start_ns")["step"].to_list() == [0, 1, None]
    assert res.metrics["exposed_per_step_ns"] == US


@pytest.mark.parametrize("kwargs", [
    {"n_ranks": 0}, {"size_buckets": (10, 5)}, {"size_buckets": (0, 5)},
    {"exposed_warn_frac": 0.5, "exposed_critical_frac": 0.2}, {"link_gbps": -1.0},
])
def test_bad_params_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        nccl.NcclParams(**kwargs)


# ---------------------------------------------------------------------------------------------
# Exposed time: brute force and the overlap pass's identity
# ---------------------------------------------------------------------------------------------
iv_st = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 40), st.integers(0, 12)),
                 max_size=10)


@settings(max_examples=150, deadline=None)
@given(iv_st, iv_st)
def test_covered_matches_brute_force(items, covers):
    df = pl.DataFrame([(g, s, s + d) for g, s, d in items],
                      schema={"g": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
                      orient="row")
    cov = pl.DataFrame([(g, s, s + d) for g, s, d in covers],
                       schema={"g": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
                       orient="row")
    got = iv.covered(df, cov, by=["g"]).collect()
    assert got.select("g", "start_ns", "end_ns").equals(df)  # rows and order kept
    for (g, s, e), c in zip(df.rows(), got["covered_ns"], strict=True):
        points = {t for cg, cs, ce in cov.rows() if cg == g for t in range(cs, ce)}
        assert c == sum(1 for t in range(s, e) if t in points)


ops_st = st.lists(
    st.tuples(st.integers(0, 1), st.sampled_from(["compute", "nccl", "memcpy_h2d", "memset"]),
              st.integers(1, 30), st.integers(1, 8), st.integers(7, 9)),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(ops_st)
def test_exposed_sum_equals_overlap_exposed_nccl(rows):
    ops = [{"s": s, "e": s + d, "dev": dev, "cls": cls, "stream": stream,
            "name": "ncclDevKernel_AllReduce_Sum_f32" if cls == "nccl" else "k"}
           for dev, cls, s, d, stream in rows]
    trace = build(ops=ops)
    res = run(trace)
    ov = overlap.run(trace, overlap.OverlapParams(), {}).tables["overlap_summary"]
    want = int(ov["exposed_nccl_ns"].fill_null(0).sum())
    # The union form always equals overlap's; the per-op sum does when NCCL ops of a device
    # never overlap each other (else it counts the shared time once per op).
    if res.tables["nccl"].is_empty():
        return
    assert res.metrics["exposed_nccl_ns"] == want
    t = res.tables["nccl"]
    self_overlap = (
        iv.total(t, ["device_id"]).collect()["busy_ns"].sum() < t["duration_ns"].sum()
    )
    if not self_overlap:
        assert res.metrics["exposed_sum_ns"] == want
    else:
        assert res.metrics["exposed_sum_ns"] >= want


# ---------------------------------------------------------------------------------------------
# Shared traces
# ---------------------------------------------------------------------------------------------
SC22 = "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite"
H100 = "nsysai-h100-2gpu/mfu_2gpu_before.sqlite"


def _raw_nccl_kernels(path) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
            "ON s.id = k.shortName WHERE s.value LIKE 'nccl%'").fetchone()[0]
    finally:
        con.close()


@pytest.mark.shared
def test_sc22_every_nccl_kernel_is_an_allreduce_with_its_exposed_time(shared_traces):
    from nsysan.load import open_trace

    path = shared_traces / SC22
    trace = open_trace(path)
    res = run(trace)
    t = res.tables["nccl"]
    assert t.height == _raw_nccl_kernels(path) == 472
    assert set(t["op"]) == {"AllReduce"}
    assert set(t["op_source"]) == {"nvtx"}  # every kernel traced back to its ncclAllReduce
    assert set(t["nvtx_range"]) == {"ncclAllReduce"}
    assert set(t["kernel_name"]) == {"ncclKernel_AllReduce_RING_LL_Sum_float"}
    assert t["exposed_ns"].null_count() == 0
    assert ((t["exposed_ns"] >= 0) & (t["exposed_ns"] <= t["duration_ns"])).all()
    assert t["bytes"].null_count() == t.height  # nsys 2022.4 exports drop NCCL payloads
    assert t["n_ranks"].unique().to_list() == [4]  # SLURM_STEP_NUM_TASKS of the capture

    ov = overlap.run(trace, overlap.OverlapParams(), {})
    summ = ov.tables["overlap_summary"].row(0, named=True)
    exposed = int(t["exposed_ns"].sum())
    # The per-op sum is overlap's exposed_nccl_ns (nccl active, compute not) exactly ...
    assert exposed == summ["exposed_nccl_ns"] == res.metrics["exposed_nccl_ns"] == 21_799_063
    # ... and not nccl_only_ns (state exactly "nccl"): the difference is the time NCCL ran
    # beside an H2D copy or a memset but no compute kernel.
    assert summ["nccl_only_ns"] == 5_368_568
    states = ov.tables["overlap"].filter(pl.col("step").is_null())
    parts = states.filter(pl.col("state").str.contains("nccl")
                          & ~pl.col("state").str.contains("compute"))
    assert int(parts["duration_ns"].sum()) == exposed
    assert set(parts["state"]) > {"nccl"}


@pytest.mark.shared
def test_h100_two_processes_sendrecv(shared_traces):
    from nsysan.load import open_trace

    trace = open_trace(shared_traces / H100)
    res = run(trace)
    t = res.tables["nccl"]
    assert t.height == _raw_nccl_kernels(shared_traces / H100) == 66
    assert set(t["op"]) == {"SendRecv"}
    per = dict(t.group_by("pid").len().iter_rows())
    assert per == {144: 33, 145: 33}
    assert t.group_by("pid").agg(pl.col("device_id").unique())["device_id"].list.len().max() == 1
    # ncclSend + ncclRecv ranges issued all but the first kernel of each process (whose
    # ranges lie before the time slice).
    assert (t["nvtx_range"] == "ncclRecv+ncclSend").sum() == 64
    assert set(t["api_name"].drop_nulls()) == {"cuLaunchKernelEx"}
    assert t["n_ranks"].unique().to_list() == [2]
    ov = overlap.run(trace, overlap.OverlapParams(), {}).tables["overlap_summary"]
    assert int(t["exposed_ns"].sum()) == int(ov["exposed_nccl_ns"].sum())


def test_registered_and_runs_after_steps_when_both_are_selected():
    from nsysan.passes import registry

    assert [s.name for s in registry.resolve(["nccl"])] == ["nccl"]
    assert [s.name for s in registry.resolve(["nccl", "steps"])] == ["steps", "nccl"]
