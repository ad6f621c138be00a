"""trace.pftrace read back with Perfetto's protobuf classes: slice counts per track equal the
GPU ops, NVTX ranges, gaps, finding windows and steps of the analysis, and every track's
slices nest."""

from __future__ import annotations

import builtins
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import REPO_ROOT, in_ci

from nsysan.api import analyze
from nsysan.cli import cli
from nsysan.report import perfetto
from nsysan.report.jsonout import findings_document

try:  # the test extra installs it; missing, these tests skip locally and fail under CI=true
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
except ImportError:
    if in_ci():
        raise
    pytest.skip("perfetto is not installed (pip install -e '.[test]')", allow_module_level=True)

EXAMPLE = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
SHARED_2GPU = "nsysai-h100-2gpu/mfu_2gpu_before.sqlite"


def _read(data: bytes) -> tuple[dict[int, str], dict[int, int | None], Counter, dict]:
    """Track names and parents, slices begun per track, and each track's slices (replayed
    with a stack: an end closes the innermost open slice, which must have begun earlier)."""
    trace = pb.Trace()
    trace.ParseFromString(data)
    names, parents, begun = {}, {}, Counter()
    interned: dict[int, str] = {}
    categories: dict[int, str] = {}
    assert trace.packet[0].sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    stacks: dict[int, list] = defaultdict(list)
    begun_cats: dict[int, Counter] = defaultdict(Counter)
    closed: dict[int, list] = defaultdict(list)
    for p in trace.packet:
        for e in p.interned_data.event_names:
            interned[e.iid] = e.name
        for e in p.interned_data.event_categories:
            categories[e.iid] = e.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            names[d.uuid] = d.name
            parents[d.uuid] = d.parent_uuid if d.HasField("parent_uuid") else None
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            begun[te.track_uuid] += 1
            stacks[te.track_uuid].append((p.timestamp, interned[te.name_iid]))
            begun_cats[te.track_uuid].update(categories[c] for c in te.category_iids)
        elif te.type == pb.TrackEvent.TYPE_SLICE_END:
            start, name = stacks[te.track_uuid].pop()  # (IndexError: an end without begin)
            assert p.timestamp >= start
            closed[te.track_uuid].append((start, p.timestamp, name))
    assert all(not s for s in stacks.values()), "slices left open"
    begun.categories = begun_cats  # type: ignore[attr-defined]
    return names, parents, begun, closed


def _by_base(names: dict[int, str], begun: Counter) -> Counter:
    """Slices per track name, overflow siblings (`name (2)`) counted with their track."""
    out: Counter = Counter()
    for uuid, n in begun.items():
        out[names[uuid].split(" (")[0]] += n
    return out


def _check(result) -> tuple[dict, Counter]:
    tables = {n: df for r in result.results.values() for n, df in r.tables.items()}
    doc = findings_document(result.diagnosis, result.trace)
    data = perfetto.build(result.trace, tables, doc["findings"])
    names, parents, begun, closed = _read(data)
    counts = _by_base(names, begun)
    ops = result.trace.gpu_ops.filter(pl.col("start_ns") > 0)
    several = {d: g["pid"].n_unique() > 1 for (d,), g in ops.partition_by(
        "device_id", as_dict=True).items()}
    want = Counter()
    for (dev, pid, stream), g in ops.partition_by(["device_id", "pid", "stream_id"],
                                                  as_dict=True).items():
        want[f"GPU {dev}/" + (f"pid {pid} stream {stream}" if several[dev]
                              else f"stream {stream}")] += g.height
    got = Counter()
    for uuid, n in begun.items():
        parent = parents[uuid]
        if parent is not None and names[parent].startswith("GPU "):
            got[names[parent] + "/" + names[uuid].split(" (")[0]] += n
    assert got == want
    cats: Counter = Counter()  # each op's class is its slice's category
    for uuid, c in begun.categories.items():
        parent = parents[uuid]
        if parent is not None and names[parent].startswith("GPU "):
            cats.update(c)
    assert cats == Counter(ops["op_class"].to_list())
    nvtx = result.trace.nvtx.filter(pl.col("end_ns").is_not_null())
    for (pid, tid), g in nvtx.partition_by(["pid", "tid"], as_dict=True).items():
        assert counts[f"NVTX pid {pid} tid {tid}"] == g.height
    gaps = tables["gaps"].filter(pl.col("scope") == "device")
    for (dev,), g in gaps.partition_by("device_id", as_dict=True).items():
        assert counts[f"gaps device {dev}"] == g.height
    assert counts["finding windows"] == sum(len(f["evidence"]["windows"])
                                            for f in doc["findings"])
    assert counts["steps"] == tables["steps"].height
    # every gap slice is named by its cause, at its own times
    gap_slices = sorted(s for u, sl in closed.items() if names[u].startswith("gaps")
                        for s in sl)
    assert gap_slices == sorted((s, e, f"gap: {c}") for s, e, c in
                                gaps.select("start_ns", "end_ns", "cause").iter_rows())
    busy = [u for u, n in names.items() if n.endswith(" busy")]
    assert len(busy) == ops["device_id"].n_unique()
    return names, counts


def test_slices_per_track_equal_the_analysis() -> None:
    names, _ = _check(analyze(EXAMPLE))
    assert "nsysan findings" in names.values()


def test_shared_two_gpu_trace(shared_traces: Path) -> None:
    src = shared_traces / SHARED_2GPU
    if not src.is_file():
        pytest.fail(f"{src} missing")
    names, _ = _check(analyze(src))
    assert {"GPU 0", "GPU 1"} <= set(names.values())


def test_overlapping_slices_go_to_sibling_tracks(monkeypatch) -> None:
    """Overlapping, identical, touching and zero-length intervals: all kept, each track's
    slices nest (checked by replaying them); packets cross many serialisation batches."""
    monkeypatch.setattr(perfetto, "_BATCH", 7)
    rng = np.random.default_rng(7)
    starts = rng.integers(0, 1000, 300)
    ends = starts + rng.integers(0, 80, 300)
    starts = np.concatenate([starts, [5, 5, 10, 10, 10]])
    ends = np.concatenate([ends, [9, 9, 10, 10, 20]])
    w = perfetto._Writer(pb)
    uuids = w.slices("lane", None, 0, starts, ends, [f"s{i}" for i in range(starts.size)])
    _, _, begun, closed = _read(w.bytes())
    assert sum(begun.values()) == starts.size and len(uuids) > 1
    got = sorted(s for sl in closed.values() for s in sl)
    assert got == sorted(zip(starts.tolist(), ends.tolist(),
                             [f"s{i}" for i in range(starts.size)], strict=True))
    for sl in closed.values():  # within a track: any two slices nest or are disjoint
        for a in sl:
            for b in sl:
                assert a[1] <= b[0] or b[1] <= a[0] or (a[0] <= b[0] and b[1] <= a[1]) \
                    or (b[0] <= a[0] and a[1] <= b[1])


def test_analyze_perfetto_and_perfetto_command(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["analyze", str(EXAMPLE), "-o", str(tmp_path / "out"), "-q",
                                 "--perfetto"])
    assert r.exit_code == 0, r.output
    folder = tmp_path / "out" / "example_ddp"
    written = folder / "trace.pftrace"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "trace.pftrace" in json.dumps(manifest["outputs"])  # listed and hashed
    from_folder, from_trace = tmp_path / "a.pftrace", tmp_path / "b.pftrace"
    r = CliRunner().invoke(cli, ["perfetto", str(folder), "-o", str(from_folder)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["perfetto", str(EXAMPLE), "-o", str(from_trace)])
    assert r.exit_code == 0, r.output
    assert from_folder.read_bytes() == from_trace.read_bytes() == written.read_bytes()


def test_perfetto_command_errors(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(
        {"inputs": [{"path": str(tmp_path / "gone.sqlite")}]}))
    (folder / "findings.json").write_text(json.dumps({"findings": []}))
    r = CliRunner().invoke(cli, ["perfetto", str(folder), "-o", str(tmp_path / "x.pftrace")])
    assert r.exit_code == 1 and "is gone" in r.output and "Error:" in r.output
    changed = tmp_path / "changed.sqlite"
    changed.write_bytes(b"1234")
    (folder / "manifest.json").write_text(json.dumps(
        {"inputs": [{"path": str(changed), "bytes": 3}]}))
    r = CliRunner().invoke(cli, ["perfetto", str(folder), "-o", str(tmp_path / "x.pftrace")])
    assert r.exit_code == 1 and "changed since it was analysed" in r.output
    r = CliRunner().invoke(cli, ["analyze", "--job", str(EXAMPLE), str(EXAMPLE), "-o",
                                 str(tmp_path / "job"), "--perfetto"])
    assert r.exit_code == 2 and "--perfetto cannot be used with --job" in r.output
    (folder / "findings.json").write_text("{")
    r = CliRunner().invoke(cli, ["perfetto", str(folder), "-o", str(tmp_path / "x.pftrace")])
    assert r.exit_code == 1 and "not a complete nsysan analyze output" in r.output
    assert not (tmp_path / "x.pftrace").exists()

    real_import = builtins.__import__

    def no_perfetto(name, *args, **kwargs):
        if name.startswith("perfetto"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_perfetto)
    for args in (["perfetto", str(EXAMPLE), "-o", str(tmp_path / "y.pftrace")],
                 ["analyze", str(EXAMPLE), "-o", str(tmp_path / "out"), "--perfetto"]):
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 1, r.output
        assert "pip install 'nsysan[perfetto]'" in r.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "y.pftrace").exists()


def test_same_bytes_from_a_row_shuffled_export(tmp_path: Path) -> None:
    """Row order is no data: the trace of a shuffled copy of the export is the same file."""
    from row_order import shuffled_copy

    shuffled = tmp_path / "example_ddp.sqlite"
    assert shuffled_copy(EXAMPLE, shuffled, seed=5)
    files = []
    for src, name in ((EXAMPLE, "a.pftrace"), (shuffled, "b.pftrace")):
        r = CliRunner().invoke(cli, ["perfetto", str(src), "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        files.append((tmp_path / name).read_bytes())
    assert files[0] == files[1]
