"""Minimal exports (issue 16 item 11): third-party tools that slice or synthesise nsys SQLite
files may lack columns nsys always writes. Those the analysis can do without get documented
defaults (docs/data-quality.md, counted as ``column_defaulted``); those it needs keep the
one-line error."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from export_mutations import (
    EXAMPLE,
    KERNEL,
    LAYERS,
    MEMCPY,
    MEMSET,
    RUNTIME,
    SYNC,
    copy_export,
    execute,
    frames,
    query,
)
from polars.testing import assert_frame_equal

import nsysan
from nsysan.cli import cli


def _drop(path: Path, table: str, *columns: str) -> None:
    execute(path, *(f'ALTER TABLE "{table}" DROP COLUMN "{c}"' for c in columns))


def _rows(path: Path, table: str) -> int:
    return query(path, f'SELECT count(*) FROM "{table}"')[0][0]


def test_activity_tables_without_process_and_context_ids(tmp_path: Path) -> None:
    full = copy_export(EXAMPLE, tmp_path / "full" / "t.sqlite")
    minimal = copy_export(EXAMPLE, tmp_path / "minimal" / "t.sqlite")
    for table in (KERNEL, MEMCPY, SYNC):
        _drop(minimal, table, "globalPid", "contextId")
    got, want = frames(minimal), frames(full)
    # one CUDA process: its ops belong to it, so every launch link survives
    assert_frame_equal(got["gpu_ops"].drop("context_id"), want["gpu_ops"].drop("context_id"))
    assert got["gpu_ops"]["context_id"].null_count() == got["gpu_ops"].height
    assert_frame_equal(got["sync"].drop("context_id"), want["sync"].drop("context_id"))
    a, b = nsysan.analyze(minimal), nsysan.analyze(full)
    for table in ("attribution", "layers", "gaps", "kernels"):
        assert_frame_equal(a.table(table), b.table(table))
    trace = nsysan.open_trace(minimal, frame_cache=False)
    trace.load_all()
    entry = trace.meta.quality["gpu_ops"]["rules"]["column_defaulted"]
    n_ops = _rows(full, KERNEL) + _rows(full, MEMCPY)
    assert entry == {"action": "defaulted", "rows": 2 * n_ops, "columns": {
        f"{KERNEL}.contextId": _rows(full, KERNEL), f"{KERNEL}.globalPid": _rows(full, KERNEL),
        f"{MEMCPY}.contextId": _rows(full, MEMCPY), f"{MEMCPY}.globalPid": _rows(full, MEMCPY)}}
    (finding,) = [f for f in a.findings if f.code == "CAPTURE_DATA_QUALITY"]
    assert finding.severity == "info"


@pytest.mark.parametrize(
    ("table", "column", "check"),
    [
        (KERNEL, "demangledName",
         lambda ops: (ops.filter(pl.col("kind") == "kernel")
                      .select((pl.col("demangled_name") == pl.col("name")).all()).item())),
        (MEMCPY, "bytes",
         lambda ops: ops.filter(pl.col("kind") == "memcpy")["bytes"].null_count() == 12),
        (KERNEL, "correlationId",
         lambda ops: ops.filter(pl.col("kind") == "kernel")["correlation_id"].null_count()
         == 624),
        (RUNTIME, "correlationId", lambda ops: ops.height == 636),
    ],
)
def test_other_columns_an_analysis_can_do_without(tmp_path: Path, table: str, column: str,
                                                  check) -> None:
    path = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    _drop(path, table, column)
    assert check(frames(path)["gpu_ops"])
    result = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    trace = nsysan.open_trace(path, frame_cache=False)
    trace.load_all()
    frame = "cuda_api" if table == RUNTIME else "gpu_ops"
    assert trace.meta.quality[frame]["rules"]["column_defaulted"]["columns"] == {
        f"{table}.{column}": _rows(path, table)}


def test_memset_without_bytes(tmp_path: Path) -> None:
    path = copy_export(LAYERS, tmp_path / "t.sqlite")
    _drop(path, MEMSET, "bytes")
    ops = frames(path)["gpu_ops"]
    assert ops.filter(pl.col("kind") == "memset")["bytes"].null_count() == 2


@pytest.mark.shared
def test_several_processes_without_process_ids_stay_unlinked(shared_traces: Path,
                                                              tmp_path: Path) -> None:
    """Two processes in one file (nsysai): an op without globalPid cannot be given to either,
    so it keeps a NULL process and joins no launch; the analysis still runs."""
    path = copy_export(shared_traces / "nsysai-h100-2gpu" / "mfu_2gpu_before.sqlite",
                       tmp_path / "t.sqlite")
    _drop(path, KERNEL, "globalPid")
    ops = frames(path)["gpu_ops"]
    kernels = ops.filter(pl.col("kind") == "kernel")
    assert kernels.height == 4010 and kernels["global_pid"].null_count() == 4010
    assert ops.filter(pl.col("kind") != "kernel")["global_pid"].null_count() == 0
    result = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("table", "column"),
    [(KERNEL, "start"), (KERNEL, "deviceId"), (KERNEL, "shortName"), (MEMCPY, "copyKind"),
     (RUNTIME, "nameId"), ("NVTX_EVENTS", "eventType"), ("OSRT_API", "globalTid")],
)
def test_columns_the_analysis_needs_keep_a_one_line_error(tmp_path: Path, table: str,
                                                          column: str) -> None:
    path = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    _drop(path, table, column)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(out)])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert f"table {table}" in lines[0] and f"lacks column {column}" in lines[0]
    assert "Traceback" not in result.output
    assert not (out / "t").exists()


def test_schema_describes_an_export_whose_frame_cannot_be_built(tmp_path: Path) -> None:
    path = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    _drop(path, KERNEL, "shortName")
    result = CliRunner().invoke(cli, ["schema", str(path)])
    assert result.exit_code == 0, result.output
    assert "cannot be built: table CUPTI_ACTIVITY_KIND_KERNEL" in result.stdout
    import json

    info = json.loads(CliRunner().invoke(cli, ["schema", str(path), "--json"]).stdout)
    assert "lacks column shortName" in info["frames"]["gpu_ops"]["error"]
    assert "error" not in info["frames"]["cuda_api"]
