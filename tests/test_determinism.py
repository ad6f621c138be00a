"""Determinism: the same input gives byte-identical outputs, however often it is analysed and
whatever the physical row order of its export (Nsight Systems 2025.6+ does not promise one).

Compared: every file nsysan writes (Parquet tables, findings.json, findings.md, pictures,
report.html) byte for byte, and manifest.json and the ownership marker without what
legitimately differs between runs (the manifest's creation time and timings; for a shuffled
copy also the input's path, bytes and hash, which differ by construction). The canonical
frames are compared too: a frame that depends on row order is a bug waiting for an output to
show it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import NO_SHARED, REPO_ROOT, shared_sqlite_files
from polars.testing import assert_frame_equal
from row_order import shuffled_copy

from nsysan.api import analyze_to_dir
from nsysan.frames import schemas, schemas_host
from nsysan.load import open_trace

FIXTURES = REPO_ROOT / "fixtures"
#: the ownership marker nsysan leaves in every folder it writes (docs/outputs.md)
MARKER = ".nsysan-output.json"
#: manifest keys that change from run to run by design
VOLATILE = ("created_utc", "timings_s")
#: ...and between two copies of an export (different bytes, same rows)
COPY_VOLATILE = (*VOLATILE, "inputs")


def outputs(out_dir: Path, volatile: tuple[str, ...] = VOLATILE) -> dict[str, bytes]:
    """Every output file's bytes; manifest.json without its ``volatile`` keys."""
    got = {}
    for path in sorted(out_dir.iterdir()):
        data = path.read_bytes()
        if path.name in ("manifest.json", MARKER):
            # the ownership marker records the input (path, size, sha256) like the manifest
            manifest = json.loads(data)
            for key in volatile:
                manifest.pop(key, None)
            data = json.dumps(manifest, sort_keys=True).encode()
        got[path.name] = data
    return got


def assert_same_outputs(a: dict[str, bytes], b: dict[str, bytes], where: str) -> None:
    assert sorted(a) == sorted(b), where
    differ = [name for name in a if a[name] != b[name]]
    assert not differ, f"{where}: {', '.join(differ)} differ"


def analyse(trace: Path | str, out: Path) -> Path:
    _, target = analyze_to_dir(trace, out)
    return target


# ---------------------------------------------------------------------------------------------
# repeated runs
# ---------------------------------------------------------------------------------------------
REPEATED = [
    "fixtures/example_ddp.sqlite",
    # ties among NVTX offenders here made findings.md/json differ in 3 of 8 runs
    "shared:sc22-ddp-4gpu-nccl/4gpu_baseline.qdrep.nsys2022.4.2.sqlite",
]


def _input(spec: str, request: pytest.FixtureRequest) -> Path:
    if spec.startswith("shared:"):
        return request.getfixturevalue("shared_traces") / spec.removeprefix("shared:")
    return REPO_ROOT / spec


@pytest.mark.parametrize("spec", REPEATED)
def test_repeated_runs_give_identical_outputs(spec: str, request: pytest.FixtureRequest,
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _input(spec, request)
    first = None
    # 8 runs each with the default pass scheduling, one pass at a time, and two at a time:
    # all 24 must agree (the number of workers must not change a result either).
    for workers in (None, "1", "2"):
        if workers is None:
            monkeypatch.delenv("NSYSAN_PASS_WORKERS", raising=False)
        else:
            monkeypatch.setenv("NSYSAN_PASS_WORKERS", workers)
        for i in range(8):
            got = outputs(analyse(trace, tmp_path / f"w{workers}-{i}"))
            if first is None:
                first = got
            else:
                assert_same_outputs(first, got, f"{trace.name}, workers={workers}, run {i}")


# ---------------------------------------------------------------------------------------------
# row-shuffled exports
# ---------------------------------------------------------------------------------------------
FIXTURE_SQLITE = sorted(p.name for p in FIXTURES.glob("*.sqlite"))
#: recorded without a GPU: no CUDA activity to analyse (their frames are checked instead)
CPU_ONLY_FIXTURES = ("cpu_host_sampling.sqlite", "cpu_nvtx_osrt.sqlite")


def _rowids_changed(a: Path, b: Path, table: str) -> bool:
    """Whether ``table`` lists its rows in another order in ``b`` than in ``a``."""
    def rows(path: Path) -> list[tuple]:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return con.execute(f'SELECT * FROM "{table}" ORDER BY rowid').fetchall()
        finally:
            con.close()

    ra, rb = rows(a), rows(b)
    assert sorted(ra, key=repr) == sorted(rb, key=repr), f"{table}: the rows themselves changed"
    return ra != rb


def _same_frame(a: pl.DataFrame, b: pl.DataFrame, where: str) -> None:
    try:
        assert_frame_equal(a, b)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from None


def _check_shuffled(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                    seed: int) -> None:
    # Both copies under the same name, analysed by a relative path from their own folder, so
    # that nothing but the row order tells them apart (findings.md names the input).
    orig, shuf = tmp_path / "orig" / src.name, tmp_path / "shuf" / src.name
    orig.parent.mkdir(parents=True)
    shuf.parent.mkdir(parents=True)
    orig.write_bytes(src.read_bytes())
    changed = shuffled_copy(src, shuf, seed=seed)
    assert changed, f"{src.name}: nothing to shuffle"
    for table in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        if table in changed:
            assert _rowids_changed(orig, shuf, table), f"{table} was not reordered"
    results = []
    for path in (orig, shuf):
        monkeypatch.chdir(path.parent)
        trace = open_trace(src.name).load_all()
        results.append((trace, outputs(analyse(trace, Path("out")), COPY_VOLATILE)))
    (a, out_a), (b, out_b) = results
    for frame in schemas.CANONICAL:
        _same_frame(a.frame(frame), b.frame(frame), f"{src.name}: frame {frame}")
    assert_same_outputs(out_a, out_b, f"{src.name} shuffled (seed {seed})")


@pytest.mark.parametrize("name", [n for n in FIXTURE_SQLITE if n not in CPU_ONLY_FIXTURES])
def test_shuffled_fixture_gives_identical_outputs(name: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in (1, 2):
        _check_shuffled(FIXTURES / name, tmp_path / f"s{seed}", monkeypatch, seed)


@pytest.mark.parametrize("name", CPU_ONLY_FIXTURES)
def test_shuffled_cpu_only_fixture_gives_identical_frames(name: str, tmp_path: Path) -> None:
    # no CUDA activity: nothing to analyse, but its frames must not depend on row order
    src = FIXTURES / name
    shuf = tmp_path / src.name
    assert shuffled_copy(src, shuf, seed=3)
    a, b = open_trace(src).load_all(), open_trace(shuf).load_all()
    assert not a.nvtx.is_empty()
    frames = [f for f in schemas.CANONICAL if f != "meta"]
    if name == "cpu_host_sampling.sqlite":  # real CPU sampling and context switches
        frames += list(schemas_host.HOST_EVIDENCE)
        assert not a.frame("sched").is_empty() and not a.frame("cpu_samples").is_empty()
    else:
        assert not a.osrt.is_empty()
    for frame in frames:
        _same_frame(a.frame(frame), b.frame(frame), frame)


@pytest.mark.shared
@pytest.mark.parametrize("name", shared_sqlite_files())
def test_shuffled_shared_trace_gives_identical_outputs(name: str, shared_traces: Path,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if name == NO_SHARED:
        pytest.fail(f"no .sqlite files under {shared_traces}")
    _check_shuffled(shared_traces / name, tmp_path, monkeypatch, seed=7)


def test_range_ids_follow_content_not_rowids(tmp_path: Path) -> None:
    """The same NVTX events listed in two orders get the same ids, and ids run in content
    order (start, then the longer range first)."""
    from conftest import gtid, make_nsys_sqlite

    t = gtid(7, 7)
    events = [
        {"start": 10, "end": 20, "eventType": 59, "globalTid": t, "text": "inner"},
        {"start": 0, "end": 100, "eventType": 59, "globalTid": t, "text": "outer"},
        {"start": 0, "end": 50, "eventType": 59, "globalTid": t, "text": "middle"},
        {"start": 10, "end": 20, "eventType": 59, "globalTid": t, "text": "twin"},
        {"start": 5, "end": 5, "eventType": 34, "globalTid": t, "text": "mark"},
    ]
    frames = []
    for i, rows in enumerate((events, events[::-1])):
        path = make_nsys_sqlite(tmp_path / f"t{i}.sqlite", {"NVTX_EVENTS": rows})
        frames.append(open_trace(path, trace_id="t").nvtx)
    assert_frame_equal(frames[0], frames[1])
    nv = frames[0]
    assert nv.select("range_id", "name").rows() == [
        (1, "outer"), (2, "middle"), (3, "mark"), (4, "inner"), (5, "twin")]
    parent = dict(nv.select("name", "parent_range_id").rows())
    assert parent == {"outer": None, "middle": 1, "mark": None, "inner": 2, "twin": 4}


def test_small_frames_do_not_depend_on_row_order(tmp_path: Path) -> None:
    """Threads named twice, a domain created twice, capture settings listed in another order:
    every choice between rows is made by content."""
    from conftest import gtid, make_nsys_sqlite

    t = gtid(7, 7)
    tables = {
        "NVTX_EVENTS": [
            {"start": 0, "end": None, "eventType": 75, "globalTid": t, "domainId": 1,
             "text": "late"},
            {"start": 3, "end": None, "eventType": 75, "globalTid": t, "domainId": 1,
             "text": "later"},
            {"start": 5, "end": 9, "eventType": 59, "globalTid": t, "domainId": 1,
             "text": "r"},
        ],
        "ThreadNames": [{"nameId": 1, "priority": 10, "globalTid": t},
                        {"nameId": 2, "priority": 10, "globalTid": t}],
        "META_DATA_CAPTURE": [{"name": "CAPTURE_EVENT_TYPE", "value": v}
                              for v in ("Cuda", "NvtxEvents", "OSRuntime")],
    }
    metas, frames = [], []
    for i, order in enumerate((1, -1)):
        path = make_nsys_sqlite(tmp_path / f"t{i}.sqlite",
                                {k: v[::order] for k, v in tables.items()},
                                strings={1: "alpha", 2: "beta"})
        tr = open_trace(path, trace_id="t")
        metas.append(tr.meta.capture)
        frames.append((tr.nvtx, tr.threads, tr.frame("meta")))
    assert metas[0] == metas[1] == {"CAPTURE_EVENT_TYPE": ["Cuda", "NvtxEvents", "OSRuntime"]}
    for a, b in zip(*frames, strict=True):
        assert_frame_equal(a, b)
    assert frames[0][0]["domain"].to_list() == ["late"]  # the earliest create names it
    assert frames[0][1]["name"].to_list() == ["beta"]  # equal priority: the greatest name
