"""`nccl._exposure` (one coverage pass over the NCCL ops and their union together) against
`intervals.covered` of each, and the prefix test in front of the communicator-init regex of
`nccl._n_ranks` (it spares the regex, never changes what matches)."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import intervals
from nsysan.frames.trace import Trace
from nsysan.passes import nccl

SCHEMA = {"device_id": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
          "op_class": pl.String}
ops_st = st.lists(
    st.tuples(st.sampled_from([0, 1, None]), st.integers(1, 200), st.integers(0, 40),
              st.sampled_from(["compute", "nccl", "memset"]))
    .map(lambda t: (t[0], t[1], t[1] + t[2], t[3])),
    max_size=30)


@settings(max_examples=150, deadline=None)
@given(ops_st)
def test_exposure_equals_covered_of_ops_and_of_their_union(rows) -> None:
    ops = pl.DataFrame(rows, schema=SCHEMA, orient="row")
    tr = Trace.from_frames("t", {"gpu_ops": ops})
    kern = ops.filter(pl.col("op_class") == "nccl").select("device_id", "start_ns", "end_ns")
    compute = ops.filter(pl.col("op_class") == "compute")
    covered, exposed = nccl._exposure(tr, kern)
    want = intervals.covered(kern, compute, by=["device_id"]).collect()["covered_ns"]
    assert covered.to_list() == want.to_list()
    mine = intervals.union(kern, ["device_id"]).collect()
    under = intervals.covered(mine, compute, by=["device_id"]).collect()["covered_ns"]
    assert exposed == int((mine["end_ns"] - mine["start_ns"]).sum() - under.sum())


def test_n_ranks_reads_only_communicator_init_ranges() -> None:
    kern = pl.DataFrame({"pid": [1, 2, 3]}, schema={"pid": pl.Int64})
    names = ["ncclCommInitRank", "ncclCommSplit", "xncclCommInitRank", "ncclCommDestroy",
             None, "ncclCommInitRankConfig"]
    nvtx = pl.DataFrame({
        "pid": [1, 2, 2, 3, 3, 3], "name": names,
        "payload_json": [f'{{"No. of ranks": {n}}}' for n in (4, 8, 99, 77, 66, 16)],
    })
    tr = Trace.from_frames("t", {"nvtx": nvtx})
    got = nccl._n_ranks(tr, nccl.NcclParams(), kern).sort("pid")
    assert got["n_ranks"].to_list() == [4, 8, 16]
