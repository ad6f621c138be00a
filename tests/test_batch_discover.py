"""Discovery of batch inputs and trace ids; skip keys and done markers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nsysan.batch import state
from nsysan.batch.discover import assign_ids, discover
from nsysan.errors import ConfigError


def touch(root: Path, rel: str, data: bytes = b"x") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "archive"
    for rel in [
        "a/run1.nsys-rep",
        "a/run1.nsys-rep.nsys2022.4.2.sqlite",  # its exports: aliases of one capture
        "a/run1.sqlite",
        "a/notes.txt",
        "b/old.qdrep",
        "b/deep/er/x.sqlite",
        "c/pq/StringIds.parquet",  # a parquetdir: one trace, not descended into
        "c/pq/CUPTI_ACTIVITY_KIND_KERNEL.parquet",
        "c/pq/inner/y.sqlite",
        ".hidden/z.sqlite",
        "a/run1.nsys-rep.nsys2022.4.2.1a2b-17f0aa.sqlite",  # nsysan's export cache
        "a/run1.nsys-rep.nsys2022.4.2.nsysan-tmpab12cd34.sqlite",
    ]:
        touch(root, rel)
    return root


def ids(traces) -> list[str]:
    return [t.trace_id for t in traces]


def test_directory_is_searched_recursively_in_sorted_order(tree):
    got = discover([tree])
    assert ids(got) == [
        "a__run1.nsys-rep",  # with its two exports (not whole SQLite files: the report wins)
        "b__deep__er__x.sqlite",
        "b__old.qdrep",
        "c__pq",
    ]
    assert [t.format for t in got] == ["nsys-rep", "sqlite", "qdrep", "parquetdir"]
    assert [p.name for p in got[0].aliases] == ["run1.nsys-rep.nsys2022.4.2.sqlite",
                                                "run1.sqlite"]
    assert got[1].group == "b__deep__er" and got[0].group == "a"


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (["a/run1.sqlite"], ["run1.sqlite"]),  # a single file: its name
        (["a/notes.txt"], ["notes.txt"]),  # named explicitly: a trace whatever the suffix
        # two exports of one capture (its report not among the inputs): one trace
        (["a/*.sqlite"], ["run1.nsys-rep"]),
        (["**/x.sqlite", "b"], ["deep__er__x.sqlite", "old.qdrep"]),  # dedup across inputs
        (["c/pq"], ["pq"]),
        (["a/run1.sqlite", "b/deep/er/x.sqlite"], ["a__run1.sqlite", "b__deep__er__x.sqlite"]),
    ],
)
def test_inputs_table(tree, monkeypatch, inputs, expected):
    monkeypatch.chdir(tree)
    assert ids(discover(inputs)) == expected


def test_output_dir_inside_input_is_excluded(tree):
    out = tree / "out"
    touch(out, "a__run1.sqlite/gaps.parquet")
    touch(out, "stray.sqlite")
    assert "out__stray.sqlite" not in ids(discover([tree], exclude=[out]))


@pytest.mark.parametrize(
    ("inputs", "message"),
    [([], "no inputs"), (["missing.sqlite"], "does not exist"), (["*.nope"], "matches nothing")],
)
def test_bad_inputs(tmp_path, monkeypatch, inputs, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        discover(inputs)


def test_ids_are_unique_and_filesystem_safe(tmp_path):
    a = touch(tmp_path, "x y/r#1.sqlite")
    b = touch(tmp_path, "x_y/r_1.sqlite")  # sanitises to the same id as a
    c = touch(tmp_path, ".dot/.r.sqlite")
    long = touch(tmp_path, "d/" + "n" * 200 + ".sqlite")
    got = ids(assign_ids([a, b, c, long]))
    assert len(set(got)) == 4
    assert got[0] != got[1] and got[0].startswith("x_y__r_1.sqlite-")
    for tid in got:
        assert tid == tid.strip(".") or not tid.startswith(".")
        assert "/" not in tid and len(tid) <= 150
        assert all(ch.isalnum() or ch in "._+-" for ch in tid)


# -- state: hashes, keys, markers ------------------------------------------------------------
def test_content_hash_of_file_and_parquetdir(tmp_path):
    f = touch(tmp_path, "f.sqlite", b"a" * (3 << 20) + b"b")
    assert state.content_sha256(f) == __import__("hashlib").sha256(f.read_bytes()).hexdigest()
    d = tmp_path / "pq"
    touch(d, "A.parquet", b"12")
    touch(d, "B.parquet", b"3")
    h1 = state.content_sha256(d)
    (d / "A.parquet").write_bytes(b"1")
    (d / "B.parquet").write_bytes(b"23")  # same concatenated bytes, other split
    assert state.content_sha256(d) != h1
    assert state.input_bytes(d) == 3


def test_skip_key_depends_on_content_version_and_params():
    params = {"passes": ["gaps"], "params": {"gaps": {"min_gap_ns": 1}}, "options": {}}
    base = state.skip_key("h", params, "0.1.0")
    assert state.skip_key("h", json.loads(json.dumps(params)), "0.1.0") == base
    assert state.skip_key("h2", params, "0.1.0") != base
    assert state.skip_key("h", params, "0.2.0") != base
    changed = {**params, "params": {"gaps": {"min_gap_ns": 2}}}
    assert state.skip_key("h", changed, "0.1.0") != base


def test_marker_roundtrip_and_mismatch(tmp_path):
    assert state.is_done(tmp_path, "k") is None
    state.write_marker(tmp_path, {"skip_key": "k", "record": {"x": 1}})
    assert state.is_done(tmp_path, "k")["record"] == {"x": 1}
    assert state.is_done(tmp_path, "other") is None
    (tmp_path / state.MARKER).write_text("{truncated")
    assert state.is_done(tmp_path, "k") is None
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_clean_stale_and_lock(tmp_path):
    import subprocess
    import sys

    from nsysan.report.atomic import host_tag

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    stale = tmp_path / f".t1.nsysan-tmp-{host_tag()}-{dead.pid}-abc"
    stale.mkdir()
    (stale / ".nsysan-output.json").write_text('{"nsysan_output": 1, "state": "writing"}')
    (stale / "gaps.parquet").write_bytes(b"x")
    # look-alikes of the names earlier versions used are someone else's: they stay
    (tmp_path / ".t1.tmp-abc").mkdir()
    (tmp_path / ".t1.old-123").mkdir()
    (tmp_path / "t1").mkdir()
    assert state.clean_stale(tmp_path) == [stale]
    assert sorted(os.listdir(tmp_path)) == [".t1.old-123", ".t1.tmp-abc", "t1"]
    with (
        state.BatchLock(tmp_path),
        pytest.raises(ConfigError, match="another nsysan batch"),
        state.BatchLock(tmp_path),
    ):
        pass
    with state.BatchLock(tmp_path):  # released on exit
        pass
