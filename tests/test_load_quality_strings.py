"""Hostile strings: text longer than the documented bound is cut as it is read, so memory stays
bounded (issue 16: one 200 MB kernel name drove the process to 24 GB and the OOM killer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import make_nsys_sqlite
from export_mutations import EXAMPLE, KERNEL, copy_export, execute, query

from nsysan.load import open_trace
from nsysan.load.parquetdir import ParquetDirSource
from nsysan.load.sqlite import SqliteSource

NAME_BYTES = 30 << 20
#: nsysan.load.quality's bounds (repeated here so that the memory test runs, and fails for its
#: own reason, on a checkout without that module)
MAX_TEXT_BYTES = 1 << 16
MAX_METADATA_TEXT_BYTES = 1 << 20
TRUNCATION_MARK = "…"


def test_the_documented_bounds() -> None:
    from nsysan.load import quality

    assert (quality.MAX_TEXT_BYTES, quality.MAX_METADATA_TEXT_BYTES, quality.TRUNCATION_MARK) \
        == (MAX_TEXT_BYTES, MAX_METADATA_TEXT_BYTES, TRUNCATION_MARK)

#: runs ``nsysan analyze`` in a child whose address space is capped well above what a clean
#: analysis needs (so a regression fails fast instead of taking the machine), with the frame
#: cache on for any size (a 200 MB name makes any export big enough for it, and writing
#: gpu_ops to the cache copied the name once per kernel); prints the exit status and peak RSS
CHILD = r"""
import json, resource, sys
import nsysan.load.cache as cache
vm = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize")]
cap = vm[0] * 1024 + (3 << 30)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
cache.MIN_BYTES = 0
from nsysan.cli import cli
try:
    cli.main(sys.argv[1:], standalone_mode=False)
    code = 0
except SystemExit as exc:
    code = exc.code
cache.flush()
print(json.dumps({"code": code,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _analyze_in_child(path: Path, out: Path, cache: Path) -> dict:
    import nsysan  # the child runs the nsysan this test imports

    package_root = str(Path(nsysan.__file__).resolve().parent.parent)
    env = {**os.environ, "NSYSAN_CACHE_DIR": str(cache), "PYTHONPATH": package_root}
    done = subprocess.run([sys.executable, "-c", CHILD, "analyze", str(path), "-o", str(out)],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_huge_kernel_name_is_cut_and_memory_stays_bounded(tmp_path: Path) -> None:
    clean = copy_export(EXAMPLE, tmp_path / "clean" / "t.sqlite")
    huge = copy_export(EXAMPLE, tmp_path / "huge" / "t.sqlite")
    # the demangled name of the most frequent kernel (120 of 624) grows by 30 MB
    (sid,) = query(huge, f"SELECT demangledName FROM {KERNEL} GROUP BY 1 "
                         "ORDER BY count(*) DESC LIMIT 1")[0]
    execute(huge, "UPDATE StringIds SET value = value || ? WHERE id = ?",
            params=("x" * NAME_BYTES, sid))
    base = _analyze_in_child(clean, tmp_path / "out_clean", tmp_path / "cache_clean")
    got = _analyze_in_child(huge, tmp_path / "out", tmp_path / "cache")
    assert got["code"] == 0
    # SQLite reads the value once to cut it; nothing copies it per kernel any more
    assert got["rss_mb"] < base["rss_mb"] + 4 * NAME_BYTES / 2**20, (got, base)
    out = tmp_path / "out" / "t"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["t"]  # no temp folder
    kernels = pl.read_parquet(out / "kernels.parquet")
    cut = [n for n in kernels["demangled_name"] if n.endswith(TRUNCATION_MARK)]
    assert len(cut) == 1 and MAX_TEXT_BYTES < len(cut[0].encode()) <= MAX_TEXT_BYTES + 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quality"]["strings"]["rules"]["text_truncated"] == {
        "action": "truncated", "rows": 1, "columns": {"StringIds.value": 1}}


LONG = {
    "ascii": "a" * (MAX_TEXT_BYTES + 10),
    "exactly the bound": "b" * MAX_TEXT_BYTES,
    "one byte over": "c" * (MAX_TEXT_BYTES + 1),
    "multi-byte at the cut": "é" * (MAX_TEXT_BYTES // 2 + 7),
    "four-byte at the cut": "x" + "\U0001f600" * (MAX_TEXT_BYTES // 4 + 3),
    "NUL inside": "env=1\x00" * (MAX_TEXT_BYTES // 6 + 50),
    "short with NUL": "A=1\x00B=2",
}


def test_long_text_is_cut_alike_by_both_sources_at_a_character_boundary(
    tmp_path: Path
) -> None:
    from nsysan.load.quality import cut_text

    strings = dict(enumerate(LONG.values(), start=1))
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {}, strings=strings)
    sqlite = SqliteSource(path).read("StringIds", ["id", "value"])
    parquetdir = tmp_path / "t.parquetdir"
    parquetdir.mkdir()
    pl.DataFrame({"id": list(strings), "value": list(strings.values())}).write_parquet(
        parquetdir / "StringIds.parquet")
    pl.DataFrame({"duration": [1]}).write_parquet(parquetdir / "ANALYSIS_DETAILS.parquet")
    parquet_source = ParquetDirSource(parquetdir)
    parquet = parquet_source.read("StringIds", ["id", "value"])
    assert sqlite.equals(parquet)
    got = dict(zip(sqlite["id"], sqlite["value"], strict=True))
    n_cut = 0
    for sid, (case, value) in zip(strings, LONG.items(), strict=True):
        raw = value.encode()
        if len(raw) <= MAX_TEXT_BYTES:
            assert got[sid] == value, case  # NULs and all
            continue
        n_cut += 1
        assert got[sid] == cut_text(value, MAX_TEXT_BYTES), case
        kept = got[sid][: -len(TRUNCATION_MARK)]
        assert got[sid].endswith(TRUNCATION_MARK) and value.startswith(kept), case
        assert MAX_TEXT_BYTES - 2 <= len(kept.encode()) <= MAX_TEXT_BYTES + 1, case
    assert SqliteSource(path).issues("StringIds") == {}  # counted by the read that cut
    assert parquet_source.issues("StringIds") == {"value": {"truncated": n_cut}}


def test_metadata_documents_have_a_larger_bound(tmp_path: Path) -> None:
    # real exports hold a 183 kB GPU-metrics YAML in TARGET_INFO_SYSTEM_ENV
    doc, too_long = "y" * 200_000, "z" * (MAX_METADATA_TEXT_BYTES + 5)
    path = make_nsys_sqlite(tmp_path / "t.sqlite", {}, strings={1: "k"})
    execute(path, "CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER, devStateName TEXT, "
                  "name TEXT, nameEnum INTEGER, value TEXT)")
    execute(path, "INSERT INTO TARGET_INFO_SYSTEM_ENV (name, value) VALUES ('a', ?), ('b', ?)",
            params=(doc, too_long))
    trace = open_trace(path)
    meta = dict(trace.meta_frame.select("key", "value").iter_rows())
    assert meta["system:a"] == doc
    assert meta["system:b"].endswith(TRUNCATION_MARK)
    assert trace.meta.quality["meta"]["rules"]["text_truncated"]["columns"] == {
        "TARGET_INFO_SYSTEM_ENV.value": 1}


def test_a_huge_nvtx_text_is_cut_and_counted_in_the_nvtx_frame(tmp_path: Path) -> None:
    path = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(path, "UPDATE NVTX_EVENTS SET text = text || ? WHERE text = 'forward'",
            params=("f" * (2 << 20),))
    trace = open_trace(path, frame_cache=False)
    names = trace.nvtx["name"].unique()
    assert not any(len(n.encode()) > MAX_TEXT_BYTES + 4 for n in names.drop_nulls())
    assert trace.meta.quality["nvtx"]["rules"]["text_truncated"] == {
        "action": "truncated", "rows": 12, "columns": {"NVTX_EVENTS.text": 12}}
