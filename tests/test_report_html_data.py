"""The timeline payload of report.html, decoded here as the page decodes it and compared with
the GPU ops, NVTX ranges, gaps and steps of the analysis."""

from __future__ import annotations

import base64
import zlib

import numpy as np
import polars as pl
import pytest
from conftest import REPO_ROOT

from nsysan.api import analyze
from nsysan.report import html_data, html_encoding, plots

EXAMPLE = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
DTYPES = {"uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "float64": "<f8"}


@pytest.fixture(scope="module")
def result():
    return analyze(EXAMPLE)


def _payload(result):
    tables = {n: df for r in result.results.values() for n, df in r.tables.items()}
    states = plots.device_timelines(result.trace, tables, None, n_bins=html_data.N_BINS)
    return html_data.timeline_data(result.trace, tables, states), tables


def _columns(payload) -> dict[str, np.ndarray]:
    raw = zlib.decompress(base64.b64decode(payload["blob"]))
    return {name: np.frombuffer(raw, DTYPES[c["type"]], c["length"], c["offset"])
            for name, c in payload["layout"].items()}


def _ops_of(payload) -> pl.DataFrame:
    """The ops as the page reads them: starts from per-lane deltas, lanes to streams."""
    c = _columns(payload)
    dev, lane = c["op_device"].astype(np.int64), c["op_lane"].astype(np.int64)
    start = np.empty(dev.size)
    for i in range(dev.size):  # (the page's loop, on purpose not vectorised)
        first = i == 0 or dev[i] != dev[i - 1] or lane[i] != lane[i - 1]
        start[i] = c["op_start"][i] if first else start[i - 1] + c["op_start"][i]
    streams = {(d["id"], k): ln["stream"] for d in payload["devices"]
               for k, ln in enumerate(d["lanes"])}
    s = payload["strings"]
    return pl.DataFrame({
        "device_id": dev, "stream_id": [streams[(d, k)] for d, k in zip(dev, lane, strict=True)],
        "start_ns": start.astype(np.int64) + payload["t0"],
        "end_ns": (start + c["op_dur"]).astype(np.int64) + payload["t0"],
        "name": [s[i] for i in c["op_name"]]})


def test_every_gpu_op_is_in_the_page(result) -> None:
    payload, _ = _payload(result)
    want = result.trace.gpu_ops.filter(pl.col("start_ns") > 0).select(
        "device_id", "stream_id", "start_ns", "end_ns", "name").cast(
        {"device_id": pl.Int64, "stream_id": pl.Int64}).sort(pl.all())
    got = _ops_of(payload).cast({"stream_id": pl.Int64}).sort(pl.all())
    assert got.equals(want)


def test_nvtx_gaps_and_steps_are_in_the_page(result) -> None:
    payload, tables = _payload(result)
    c = _columns(payload)
    # (the example has one thread, which launches every op; a range that ended before the
    # first GPU op is off the timeline)
    nvtx = result.trace.nvtx.filter(pl.col("end_ns") >= payload["t0"])
    assert result.trace.nvtx["global_tid"].n_unique() == 1
    assert c["nvtx_start"].size == nvtx.height == payload["nvtx"]["n"]
    assert sorted((c["nvtx_start"] + payload["t0"]).tolist()) == sorted(
        np.maximum(nvtx["start_ns"].to_numpy(), payload["t0"]).tolist())
    gaps = tables["gaps"].filter(pl.col("scope") == "device")
    got = sorted((g[0] + payload["t0"], g[1] + payload["t0"], payload["strings"][g[2]])
                 for d in payload["devices"] for g in d["gaps"])
    assert got == sorted(gaps.select("start_ns", "end_ns", "cause").rows())
    assert [s[2] for s in payload["steps"]] == tables["steps"].sort("start_ns")["step"].to_list()


def test_lane_overview_is_the_busy_share(result) -> None:
    """Each lane's overview bins equal the length of its ops' union in each bin (merged by a
    plain loop, clipped to every bin)."""
    payload, _ = _payload(result)
    t0, span, n = payload["t0"], payload["t1"], payload["n_bins"]
    ops = result.trace.gpu_ops.filter(pl.col("start_ns") > 0)
    edges = np.linspace(t0, t0 + span, n + 1).round().astype(np.int64)
    for lane in payload["devices"][0]["lanes"]:
        merged: list[list[int]] = []
        for s, e in sorted(ops.filter(pl.col("stream_id") == lane["stream"])
                           .select("start_ns", "end_ns").iter_rows()):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        covered = np.zeros(n)
        for s, e in merged:
            covered += np.clip(np.minimum(e, edges[1:]) - np.maximum(s, edges[:-1]), 0, None)
        want = covered / np.maximum(np.diff(edges), 1)
        got = np.frombuffer(base64.b64decode(lane["overview"]), np.uint8) / 255
        assert np.abs(got - want).max() <= 0.5 / 255 + 1e-9


def test_raw_ops_are_capped_longest_first(result, monkeypatch) -> None:
    monkeypatch.setattr(html_data, "MAX_RAW_OPS", 50)
    payload, _ = _payload(result)
    got = _ops_of(payload)
    assert got.height == 50
    ops = result.trace.gpu_ops.filter(pl.col("start_ns") > 0)
    durations = (ops["end_ns"] - ops["start_ns"]).sort(descending=True)
    assert sorted((got["end_ns"] - got["start_ns"]).to_list(), reverse=True) == \
        durations.head(50).to_list()
    assert any("50 longest of 636" in note for note in payload["notes"])
    # the overview still counts every op
    assert sum(ln["n_ops"] for ln in payload["devices"][0]["lanes"]) == 636


@pytest.mark.parametrize("values", [[], [None], ["b", None, "a", "", "b", "é"], ["x"] * 5])
def test_string_table_of_codes_is_that_of_the_text(values) -> None:
    """`Strings.index` on a Categorical (its codes) gives the table and indexes it gives on
    the same names as text; a table shared by several calls grows in order of first use."""
    text = pl.Series(values, dtype=pl.String)
    by_text, by_code = html_encoding.Strings(), html_encoding.Strings()
    for s in (pl.Series(["z", "a"]), text, text.reverse()):
        want = by_text.index(s.cast(pl.String))
        got = by_code.index(s.cast(pl.Categorical()))
        assert got.tolist() == want.tolist()
        assert by_code.values == by_text.values


def test_streamed_blob_is_the_deflate_of_the_joined_columns() -> None:
    """Each column is deflated as it is added: the page's bytes are those of deflating (level
    1) the columns joined, each in its narrowest type and padded to 8 bytes."""
    cols = [np.arange(1000) % 7, np.arange(70000) * 3, np.zeros(0, np.int64),
            np.array([2 ** 33]), np.arange(5) + 300]
    blob = html_encoding.Blob()
    for i, c in enumerate(cols):
        blob.add(f"c{i}", c)
    joined = b""
    for c, t in zip(cols, ["<u1", "<u4", "<u1", "<f8", "<u2"], strict=True):
        raw = c.astype(t).tobytes()
        joined += raw + b"\0" * (-len(raw) % 8)
    assert [c["type"] for c in blob.layout.values()] == [
        "uint8", "uint32", "uint8", "float64", "uint16"]
    assert blob.encode() == base64.b64encode(zlib.compress(joined, 1)).decode("ascii")
    assert blob.encode() == base64.b64encode(zlib.compress(joined, 1)).decode("ascii")
    with pytest.raises(ValueError, match="encoded already"):
        blob.add("late", np.arange(3))
