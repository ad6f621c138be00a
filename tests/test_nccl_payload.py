"""NCCL NVTX payloads in both export layouts: jsonText (mid-2024) and binaryData + payload
schemas (2025+), including missing, partial and undecodable payloads."""

from __future__ import annotations

import json
import sqlite3
import struct

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from nsysan.load import open_trace
from nsysan.passes import nccl
from nsysan.testing.payloads import NCCL_SCHEMAS, Payload, add_payloads, encode_blob
from nsysan.testing.scaling_job import ScalingJob, write_scaling_job
from nsysan.testing.synth import TraceBuilder

ID = 2**63 + 5  # a u64 communicator id above the i64 range


def _one(tmp_path, payloads, layout="binary", builder_layout="2023.4"):
    b = TraceBuilder()
    g = b.add_process(100)
    b.add_gpu(0)
    b.add_nvtx_range(g, 1_000, 5_000, "ncclAllReduce", domain="NCCL")
    b.add_nvtx_range(g, 6_000, 9_000, "ncclCommInitRank", domain="NCCL")
    b.add_nvtx_range(g, 10_000, 12_000, "ncclAllGather", domain="NCCL")
    path = b.write(tmp_path / "p.sqlite", builder_layout)
    if payloads:
        add_payloads(path, [Payload(s, g, name, schema, values, cut)
                            for s, name, schema, values, cut in payloads], layout)
    return path


def _payloads(path):
    t = open_trace(path)
    df = t.frame("nvtx").filter(pl.col("style") != "mark").sort("start_ns")
    return [None if p is None else json.loads(p) for p in df["payload_json"]], t.meta.notes


FULL = [
    (1_000, "ncclAllReduce", "all_reduce",
     {"NCCL communicator ID": ID, "Message size [bytes]": 1 << 20}, None),
    (6_000, "ncclCommInitRank", "comm_init",
     {"NCCL communicator ID": 7, "No. of ranks": 8, "Rank": 3, "CUDA device": 2}, None),
]


def test_binary_payloads_decode_to_the_json_of_mid_2024_exports(tmp_path):
    got, notes = _payloads(_one(tmp_path, FULL))
    # the reduction-op enum has no documented width without NVTX_PAYLOAD_ENUMS: left out
    assert got == [{"NCCL communicator ID": ID, "Message size [bytes]": 1 << 20},
                   {"NCCL communicator ID": 7, "No. of ranks": 8, "Rank": 3, "CUDA device": 2},
                   None]
    assert "NVTX binary payloads: 2 of 2 decoded" in notes


def test_json_layout_reads_the_same_values(tmp_path):
    got, _ = _payloads(_one(tmp_path, FULL, layout="json", builder_layout="2022.4"))
    assert got[:2] == [FULL[0][3], FULL[1][3]] and got[2] is None


def test_partial_blob_keeps_the_fields_inside_it(tmp_path):
    cut = [(6_000, "ncclCommInitRank", "comm_init", FULL[1][3], 32 + 12)]  # id + No. of ranks
    got, _ = _payloads(_one(tmp_path, cut))
    assert got[1] == {"NCCL communicator ID": 7, "No. of ranks": 8}
    assert got[0] is None and got[2] is None  # no payload at all: null, not zeros


def test_blob_shorter_than_its_header_or_of_an_unknown_schema_is_no_payload(tmp_path):
    path = _one(tmp_path, [(1_000, "ncclAllReduce", "all_reduce", FULL[0][3], 20)])
    con = sqlite3.connect(path)
    unknown = struct.pack("<QQQQ", 1, 99, 8, 32) + struct.pack("<Q", 5)
    con.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE text = 'ncclAllGather'",
                (unknown,))
    con.commit()
    con.close()
    got, notes = _payloads(path)
    assert got == [None, None, None]
    assert any("0 of 2 decoded" in n and "1 bad header" in n and "1 no schema" in n
               for n in notes), notes


def test_ambiguous_schemas_are_not_guessed(tmp_path):
    path = _one(tmp_path, FULL[:1])
    con = sqlite3.connect(path)
    # a second process registered another layout under the same (domainId, schemaId)
    con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (1, ?, 1, NULL, 17, "
                "'Other', NULL, NULL, 8)", (NCCL_SCHEMAS["all_reduce"].schema_id,))
    con.commit()
    con.close()
    got, notes = _payloads(path)
    assert got[0] is None
    assert any("ambiguous" in n for n in notes)


def test_no_entries_table_means_no_payload_and_a_note(tmp_path):
    path = _one(tmp_path, FULL[:1])
    con = sqlite3.connect(path)
    con.execute("DROP TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES")
    con.commit()
    con.close()
    got, notes = _payloads(path)
    assert got == [None, None, None]
    assert any("no NVTX_PAYLOAD_SCHEMA_ENTRIES" in n for n in notes)


def test_encode_blob_layout():
    blob = encode_blob(1, NCCL_SCHEMAS["all_gather"], {"Message size [bytes]": 9})
    assert struct.unpack("<QQQQ", blob[:32]) == (1, NCCL_SCHEMAS["all_gather"].schema_id,
                                                 16, 32)
    assert struct.unpack("<QQ", blob[32:]) == (0, 9)


@pytest.mark.parametrize("layouts", [("2022.4", "json"), ("2023.4", "binary")])
def test_nccl_pass_bytes_and_busbw_from_payloads(tmp_path, layouts):
    job = ScalingJob(n_gpus=4, gpus_per_node=4, n_steps=3, comm_ns=8_000_000,
                     message_bytes=3 << 24, layout=layouts[0], payload_layout=layouts[1])
    truth = write_scaling_job(tmp_path, job)
    table = nccl.nccl_ops(open_trace(truth.paths[0]), nccl.NcclParams())
    assert table.height == 4 * 3
    assert table["bytes"].unique().to_list() == [3 << 24]
    assert table["n_ranks"].unique().to_list() == [4]  # from the comm-init payload
    # no rank waits here, so every kernel's busbw is the planted transfer busbw
    assert table["busbw_gbps"].to_list() == pytest.approx([truth.busbw_gbps] * 12, rel=1e-12)


def test_both_layouts_give_the_same_nccl_table(tmp_path):
    tables = []
    for layout, payload in (("2023.4", "json"), ("2023.4", "binary")):
        d = tmp_path / payload
        job = ScalingJob(n_gpus=2, gpus_per_node=2, n_steps=2, layout=layout,
                         payload_layout=payload)
        t = open_trace(write_scaling_job(d, job).paths[0])
        tables.append(nccl.nccl_ops(t, nccl.NcclParams()).drop("trace_id"))
    assert_frame_equal(tables[0], tables[1])


def test_without_payloads_sizes_stay_unknown(tmp_path):
    job = ScalingJob(n_gpus=2, gpus_per_node=2, n_steps=2, payload_layout=None)
    table = nccl.nccl_ops(open_trace(write_scaling_job(tmp_path, job).paths[0]),
                          nccl.NcclParams())
    assert table["bytes"].null_count() == table.height
    assert table["busbw_gbps"].null_count() == table.height


def test_real_h100_trace_has_schemas_but_no_sizes(shared_traces):
    t = open_trace(shared_traces / "nsysai-h100-2gpu" / "mfu_2gpu_before.sqlite")
    assert t.frame("nvtx")["payload_json"].null_count() == t.frame("nvtx").height
    table = nccl.nccl_ops(t, nccl.NcclParams())
    assert table.height > 0 and table["bytes"].null_count() == table.height


def test_decoded_payloads_do_not_depend_on_row_order(tmp_path):
    from row_order import shuffled_copy

    job = ScalingJob(n_gpus=4, gpus_per_node=4, n_steps=3, layout="2023.4",
                     payload_layout="binary")
    src = write_scaling_job(tmp_path / "a", job).paths[0]
    dst = tmp_path / "shuffled.sqlite"
    changed = shuffled_copy(src, dst, seed=3)
    assert "NVTX_EVENTS" in changed
    frames = [open_trace(p).frame("nvtx").drop("trace_id")
              for p in (src, dst)]
    assert frames[0]["payload_json"].null_count() < frames[0].height
    assert_frame_equal(frames[0], frames[1])


def test_parquetdir_binary_column_decodes_the_same(tmp_path):
    """A parquetdir export stores binaryData as a Parquet binary column."""
    job = ScalingJob(n_gpus=2, gpus_per_node=2, n_steps=2, layout="2023.4",
                     payload_layout="binary")
    src = write_scaling_job(tmp_path / "a", job).paths[0]
    out = tmp_path / "run.parquetdir"
    out.mkdir()
    con = sqlite3.connect(src)
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        cur = con.execute(f'SELECT * FROM "{table}"')
        cols = [c[0] for c in cur.description]
        rows = cur.fetchall()
        data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
        schema = {c: (pl.Binary if c == "binaryData" else None) for c in cols}
        df = pl.DataFrame({c: pl.Series(c, v, dtype=schema[c], strict=False)
                           for c, v in data.items()})
        df.write_parquet(out / f"{table}.parquet")
    con.close()
    a = open_trace(src).frame("nvtx").drop("trace_id")
    b = open_trace(out).frame("nvtx").drop("trace_id")
    assert a["payload_json"].null_count() < a.height
    assert a["payload_json"].to_list() == b["payload_json"].to_list()


def test_hostile_schema_offsets_are_left_out(tmp_path):
    path = _one(tmp_path, FULL[:1])
    con = sqlite3.connect(path)
    sid = NCCL_SCHEMAS["all_reduce"].schema_id
    con.execute("UPDATE NVTX_PAYLOAD_SCHEMA_ENTRIES SET offset = -8 WHERE schemaId = ? AND "
                "idx = 1", (sid,))
    con.commit()
    con.close()
    got, _ = _payloads(path)
    assert got[0] == {"NCCL communicator ID": ID}  # the size field is unreadable: left out
