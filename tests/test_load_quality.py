"""The data-quality contract for rows (docs/data-quality.md): every kind of impossible row is
handled by one rule and counted, and the frames of a broken export equal those of the same
export repaired by hand (the impossible rows deleted, the copies removed).

NVTX rows are "deleted" by turning them into non-events (eventType 999): a range's id is its
row position, so a real deletion would renumber the ranges after it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import gtid, make_nsys_sqlite, shared_files
from export_mutations import (
    EXAMPLE,
    KERNEL,
    LAYERS,
    MEMCPY,
    MEMSET,
    RUNTIME,
    SYNC,
    assert_same_frames,
    copy_export,
    execute,
    frames,
    quality,
    query,
    relax,
)
from polars.testing import assert_frame_equal

import nsysan
from nsysan.cli import cli
from nsysan.load import open_trace

DURATION = 595_967_238  # ANALYSIS_DETAILS.duration of example_ddp
INT64_MAX = (1 << 63) - 1
#: table -> (frame, the rows of the table that are events of that frame)
EVENTS = {
    KERNEL: ("gpu_ops", "1"),
    MEMCPY: ("gpu_ops", "1"),
    MEMSET: ("gpu_ops", "1"),
    RUNTIME: ("cuda_api", "1"),
    SYNC: ("sync", "1"),
    "OSRT_API": ("osrt", "eventClass = 27"),
    "PROFILER_OVERHEAD": ("overhead", "1"),
    "NVTX_EVENTS": ("nvtx", "eventType = 59"),
}


def _pair(tmp_path: Path, src: Path = EXAMPLE) -> tuple[Path, Path]:
    return (copy_export(src, tmp_path / "broken" / "t.sqlite"),
            copy_export(src, tmp_path / "repaired" / "t.sqlite"))


def _delete(path: Path, table: str, where: str) -> None:
    """Delete rows by hand (NVTX: make them non-events, keeping every row position)."""
    if table == "NVTX_EVENTS":
        execute(path, f"UPDATE NVTX_EVENTS SET eventType = 999 WHERE {where}")
    else:
        execute(path, f'DELETE FROM "{table}" WHERE {where}')


def _count(path: Path, table: str, where: str) -> int:
    return query(path, f'SELECT count(*) FROM "{table}" WHERE {where}')[0][0]


def _analyze(path: Path, out: Path) -> tuple[str, Path]:
    result = CliRunner().invoke(cli, ["analyze", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.stdout, out / path.stem


def _busy(summary: str) -> str:
    return re.search(r"GPU busy ([\d.]+%)", summary).group(1)  # type: ignore[union-attr]


# --- negative durations -----------------------------------------------------------------------


@pytest.mark.parametrize("table", list(EVENTS))
def test_end_before_start_is_dropped_and_counted(tmp_path: Path, table: str) -> None:
    src = LAYERS if table == MEMSET else EXAMPLE
    broken, repaired = _pair(tmp_path, src)
    frame, events = EVENTS[table]
    where = f"{events} AND rowid % 3 = 1"
    n = _count(broken, table, where)
    assert n
    execute(broken, f'UPDATE "{table}" SET end = start - 1000 WHERE {where}')
    _delete(repaired, table, where)
    assert_same_frames(broken, repaired)
    assert quality(broken) == {frame: {"negative_duration": n}}
    assert quality(repaired) == {}


def test_negative_kernel_durations_do_not_enter_the_analysis(tmp_path: Path) -> None:
    # issue 16: GPU busy 73.0% -> 66.2% and min_ns -1 ms, without a note
    broken, repaired = _pair(tmp_path)
    execute(broken, f"UPDATE {KERNEL} SET end = start - 1000000 WHERE rowid % 50 = 0")
    _delete(repaired, KERNEL, "rowid % 50 = 0")
    got, want = nsysan.analyze(broken), nsysan.analyze(repaired)
    assert got.table("kernels")["min_ns"].min() > 0  # type: ignore[operator]
    assert_frame_equal(got.table("kernels"), want.table("kernels"))
    assert_frame_equal(got.table("overlap_summary"), want.table("overlap_summary"))
    assert "CAPTURE_DATA_QUALITY" in [f.code for f in got.findings]


def test_nvtx_range_ending_before_it_starts_is_reported_not_silently_lost(
    tmp_path: Path,
) -> None:
    # issue 16: such a range silently vanished from the layers (it can contain no launch)
    broken, repaired = _pair(tmp_path)
    where = "rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE text = 'forward')"
    execute(broken, f"UPDATE NVTX_EVENTS SET end = start - 5 WHERE {where}")
    _delete(repaired, "NVTX_EVENTS", where)
    got, want = nsysan.analyze(broken), nsysan.analyze(repaired)
    nvtx = got.trace.frame("nvtx")
    assert nvtx.filter(pl.col("end_ns") < pl.col("start_ns")).is_empty()
    assert_frame_equal(got.table("layers"), want.table("layers"))
    assert_frame_equal(got.table("attribution"), want.table("attribution"))
    (found,) = [f for f in got.findings if f.code == "CAPTURE_DATA_QUALITY"]
    assert "nvtx 1 negative_duration (dropped)" in found.message


# --- NULL and non-integer timestamps ----------------------------------------------------------


@pytest.mark.parametrize("value", [None, "abc", 1.5, b"\x01\x02"], ids=["null", "text", "real",
                                                                        "blob"])
@pytest.mark.parametrize(("table", "column"), [(KERNEL, "start"), (KERNEL, "end"),
                                               (RUNTIME, "start"), ("OSRT_API", "end")])
def test_null_or_non_integer_timestamp_drops_the_row(
    tmp_path: Path, table: str, column: str, value: object
) -> None:
    broken, repaired = _pair(tmp_path)
    frame, events = EVENTS[table]
    where = f"{events} AND rowid % 7 = 2"
    n = _count(broken, table, where)
    relax(broken, table)  # nsys declares start/end NOT NULL
    execute(broken, f'UPDATE "{table}" SET "{column}" = ? WHERE {where}', params=(value,))
    _delete(repaired, table, where)
    assert_same_frames(broken, repaired)
    expected = {"missing_timestamp": n} | ({} if value is None else {"value_not_integer": n})
    assert quality(broken) == {frame: expected}


@pytest.mark.parametrize("decl", ["TEXT", "REAL", ""])
def test_timestamps_declared_with_another_type_keep_their_values(tmp_path: Path,
                                                                 decl: str) -> None:
    """A third-party export may declare every column TEXT or REAL, or give none a type:
    integers stored so are read as integers, and nothing is counted."""
    broken, clean = _pair(tmp_path)
    relax(broken, KERNEL, {"start": decl, "end": decl, "correlationId": decl})
    assert_same_frames(broken, clean)
    assert quality(broken) == {}
    # and what is not an integer is still NULL and counted, blobs in untyped columns too
    execute(broken, f"UPDATE {KERNEL} SET end = ? WHERE rowid % 10 = 3", params=(b"\x00",))
    _delete(clean, KERNEL, "rowid % 10 = 3")
    assert_same_frames(broken, clean)
    n = _count(broken, KERNEL, "rowid % 10 = 3")
    assert quality(broken) == {"gpu_ops": {"missing_timestamp": n, "value_not_integer": n}}


def test_nvtx_end_that_is_not_an_integer_reads_as_unterminated(tmp_path: Path) -> None:
    broken, repaired = _pair(tmp_path)
    where = "eventType = 59 AND rowid % 9 = 4"
    n = _count(broken, "NVTX_EVENTS", where)
    execute(broken, f"UPDATE NVTX_EVENTS SET end = 'soon' WHERE {where}")
    execute(repaired, f"UPDATE NVTX_EVENTS SET end = NULL WHERE {where}")
    assert_same_frames(broken, repaired)
    assert quality(broken) == {"nvtx": {"value_not_integer": n}}
    assert frames(broken)["nvtx"]["unterminated"].sum() >= n


# --- outside the session ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "dropped"),
    [
        ("1000000000000000", "1000000000100000", True),  # issue 16: one kernel at t = 1e15 ns
        ("start", str(INT64_MAX), True),  # issue 16: a traceback
        (str(INT64_MAX), str(INT64_MAX), True),
        ("-5000000000", "start", True),  # 5 s before a 0.6 s session
        ("start", "end + 500000000", False),  # in flight at the stop: inside the slack
        ("-100", "end", False),
    ],
)
def test_timestamps_outside_the_session(tmp_path: Path, start: str, end: str,
                                        dropped: bool) -> None:
    broken, repaired = _pair(tmp_path)
    where = "rowid = 5"
    execute(broken, f"UPDATE {KERNEL} SET start = {start}, end = {end} WHERE {where}")
    if dropped:
        _delete(repaired, KERNEL, where)
    else:
        execute(repaired, f"UPDATE {KERNEL} SET start = {start}, end = {end} WHERE {where}")
    assert_same_frames(broken, repaired)
    assert quality(broken) == ({"gpu_ops": {"outside_session": 1}} if dropped else {})
    summary, out = _analyze(broken, tmp_path / "out")
    assert _busy(summary) == _busy(_analyze(repaired, tmp_path / "out2")[0])
    if dropped:  # the summary line and findings.md agree (the 1e15 kernel: 0.0% vs 73.0%)
        assert f"| GPU busy | {_busy(summary)} |" in (out / "findings.md").read_text()


def _synthetic(path: Path, starts: list[int], *, duration: int | None,
               export: list[dict] | None = None) -> Path:
    gpid = gtid(7, 0)
    kernels = [{"start": s, "end": s + 1000, "deviceId": 0, "contextId": 1, "streamId": 7,
                "correlationId": i + 1, "globalPid": gpid, "shortName": 1, "demangledName": 1}
               for i, s in enumerate(starts)]
    tables: dict[str, list[dict]] = {KERNEL: kernels}
    if export is not None:
        tables["EXPORT_META_DATA"] = export
    return make_nsys_sqlite(path, tables, strings={1: "k"}, duration=duration)


BULK = [10_000_000_000 + 1_000_000 * i for i in range(200)]  # 10 s to 10.2 s


@pytest.mark.parametrize(
    ("case", "duration", "export"),
    [
        ("no ANALYSIS_DETAILS (2020.x)", None, None),
        ("a duration that does not describe the data", 1_000_000, None),
        ("shifted at export", 1_000_000,
         [{"name": "EXPORT_PARAM_TIME_SHIFT", "value": "10000000000"}]),
    ],
)
def test_session_window_from_the_data_when_the_export_cannot_say(
    tmp_path: Path, case: str, duration: int | None, export: list[dict] | None
) -> None:
    """Without a usable session length the window is the central span of the data widened
    tenfold: the bulk stays, far outliers (and int64-max) go."""
    outliers = [10**15, INT64_MAX - 1000, 1]
    trace = open_trace(_synthetic(tmp_path / "t.sqlite", BULK + outliers, duration=duration,
                                  export=export))
    ops = trace.gpu_ops
    assert ops["start_ns"].to_list() == BULK
    assert trace.meta.quality["gpu_ops"]["rules"] == {
        "outside_session": {"action": "dropped", "rows": 3}}
    notes = trace.meta.quality["gpu_ops"]["notes"]
    assert bool(notes) == (case == "a duration that does not describe the data"), notes


# --- copies -----------------------------------------------------------------------------------


@pytest.mark.parametrize("table", list(EVENTS))
def test_a_table_written_twice_is_read_once(tmp_path: Path, table: str) -> None:
    src = LAYERS if table == MEMSET else EXAMPLE
    broken, clean = _pair(tmp_path, src)
    frame, events = EVENTS[table]
    execute(broken, f'INSERT INTO "{table}" SELECT * FROM "{table}"')
    n = _count(clean, table, events)
    assert_same_frames(broken, clean)
    assert quality(broken) == {frame: {"duplicate_row": n}}


def test_exact_copies_anywhere_in_the_table(tmp_path: Path) -> None:
    broken, clean = _pair(tmp_path)
    # copies of every third kernel, appended in reverse order
    execute(broken, f"INSERT INTO {KERNEL} SELECT * FROM {KERNEL} WHERE rowid % 3 = 0 "
                    "ORDER BY rowid DESC")
    assert_same_frames(broken, clean)
    assert quality(broken) == {"gpu_ops": {"duplicate_row": 208}}
    result = nsysan.analyze(broken)
    assert result.table("kernels")["count"].sum() == 624


# --- StringIds --------------------------------------------------------------------------------


def _kernel_name_id(path: Path) -> int:
    return query(path, f"SELECT shortName FROM {KERNEL} ORDER BY start LIMIT 1")[0][0]


@pytest.mark.parametrize("other", ["aaa_first", "zzz_last"])
def test_conflicting_string_ids_keep_the_smallest_value_whatever_the_order(
    tmp_path: Path, other: str
) -> None:
    # issue 16: duplicate ids were a traceback
    one, two = _pair(tmp_path)
    sid = _kernel_name_id(one)
    name = query(one, f"SELECT value FROM StringIds WHERE id = {sid}")[0][0]
    for path in (one, two):
        relax(path, "StringIds")  # nsys declares the id a PRIMARY KEY
    execute(one, f"INSERT INTO StringIds VALUES ({sid}, ?)", params=(other,))
    # the same rows, the other value first
    execute(two, "CREATE TABLE s AS SELECT * FROM StringIds", "DELETE FROM StringIds")
    execute(two, f"INSERT INTO StringIds VALUES ({sid}, ?)", params=(other,))
    execute(two, "INSERT INTO StringIds SELECT * FROM s ORDER BY rowid", "DROP TABLE s")
    assert_same_frames(one, two)
    ops = frames(one)["gpu_ops"]
    assert min(name, other) in ops["name"].to_list()
    assert max(name, other) not in ops["name"].to_list()
    assert quality(one)["strings"] == {"conflicting_string_id": 1}


def test_string_rows_written_twice_are_read_once(tmp_path: Path) -> None:
    broken, clean = _pair(tmp_path)
    relax(broken, "StringIds")
    execute(broken, "INSERT INTO StringIds SELECT * FROM StringIds")
    assert_same_frames(broken, clean)
    assert quality(broken) == {"strings": {"duplicate_row": 35}}


# --- duplicate launch rows for one correlation id ---------------------------------------------

#: rowid of example_layers' name "cudaLaunchKernel_v7000" and of the twin's name
_LAUNCH = "(SELECT id FROM StringIds WHERE value = 'cudaLaunchKernel_v7000')"


def _twins(path: Path, *, inner_suffixed: bool, shift: int = 200_000) -> int:
    """Give every launch call a nested twin with the same correlation id, named without the
    version suffix, as an MPI + CUDA export (schema 2.9.1) has them: the twin encloses the
    call (``inner_suffixed``) or the call encloses the twin. Returns the number of twins."""
    relax(path, "StringIds")
    execute(path, "INSERT INTO StringIds SELECT max(id) + 1, 'cudaLaunchKernel' FROM StringIds")
    twin = "(SELECT id FROM StringIds WHERE value = 'cudaLaunchKernel')"
    outer, inner = (f"start - {shift}", f"end + {shift}"), ("start", "end")
    twin_times, call_times = (outer, inner) if inner_suffixed else (inner, outer)
    n = query(path, f"SELECT count(*) FROM {RUNTIME} WHERE nameId = {_LAUNCH}")[0][0]
    execute(
        path,
        f"INSERT INTO {RUNTIME} SELECT {twin_times[0]}, {twin_times[1]}, eventClass, globalTid, "
        f"correlationId, {twin}, returnValue, callchainId FROM {RUNTIME} "
        f"WHERE nameId = {_LAUNCH}",
        f"UPDATE {RUNTIME} SET start = {call_times[0]}, end = {call_times[1]} "
        f"WHERE nameId = {_LAUNCH}",
    )
    return n


@pytest.mark.parametrize("inner_suffixed", [True, False])
def test_duplicate_launch_rows_count_each_gpu_op_once(tmp_path: Path,
                                                      inner_suffixed: bool) -> None:
    twins, clean = _pair(tmp_path, LAYERS)
    n = _twins(twins, inner_suffixed=inner_suffixed, shift=0 if inner_suffixed else 1)
    assert quality(twins) == {"cuda_api": {"duplicate_correlation": n}}
    got, want = nsysan.analyze(twins), nsysan.analyze(clean)
    assert_frame_equal(got.table("attribution"), want.table("attribution"))
    assert got.table("attribution")["n_gpu_ops"].to_list() == \
        want.table("attribution")["n_gpu_ops"].to_list()


@pytest.mark.nsys
@pytest.mark.parametrize("inner_suffixed", [True, False])
def test_duplicate_launch_rows_match_nsys_nvtxgpuproj(
    tmp_path: Path, nsys_bin: Path, inner_suffixed: bool
) -> None:
    """Nsight Systems' own projection of NVTX ranges onto the GPU is the oracle: its
    NumGPUOps and projected span per range equal nsysan's on the export with twins."""
    import csv
    import subprocess

    twins = copy_export(LAYERS, tmp_path / "twins.sqlite")
    _twins(twins, inner_suffixed=inner_suffixed)
    done = subprocess.run(
        [str(nsys_bin), "stats", "-r", "nvtxgpuproj", "-f", "csv", "-o", str(tmp_path / "o"),
         "--force-overwrite", "true", str(twins)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )
    report = tmp_path / "o_nvtxgpuproj.csv"
    assert report.is_file(), done.stdout + done.stderr
    rows = list(csv.DictReader(report.open()))
    # ranges matched by (name, start): range ids need not be nsys's row ids
    oracle = {(r["Name"].split(":")[-1], int(r["Orig Start (ns)"])):
              (int(r["NumGPUOps"]), int(r["Projected Start (ns)"])) for r in rows}
    attribution = nsysan.analyze(twins).table("attribution")
    ours = {(name, start): (n, s) for name, start, n, s in attribution
            .filter(pl.col("n_gpu_ops") > 0)
            .select("name", "cpu_start_ns", "n_gpu_ops", "proj_start_ns").iter_rows()}
    assert oracle and ours == oracle


# --- where the counts appear ------------------------------------------------------------------


def test_manifest_schema_and_finding_show_the_counts(tmp_path: Path) -> None:
    broken = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(broken, f"UPDATE {KERNEL} SET end = start - 1 WHERE rowid % 50 = 0")
    _, out = _analyze(broken, tmp_path / "out")
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["quality"]["gpu_ops"]
    assert entry["rules"] == {"negative_duration": {"action": "dropped", "rows": 12}}
    assert entry["rows"] == 636 - 12
    findings = json.loads((out / "findings.json").read_text())
    (found,) = [f for f in findings["findings"] if f["code"] == "CAPTURE_DATA_QUALITY"]
    assert found["severity"] == "warning" and found["layer"] == "capture"  # 12/636 = 1.9%
    runner = CliRunner()
    text = runner.invoke(cli, ["schema", str(broken)])
    assert text.exit_code == 0 and "gpu_ops    negative_duration: 12 dropped" in text.stdout
    info = json.loads(runner.invoke(cli, ["schema", str(broken), "--json"]).stdout)
    assert info["quality"]["gpu_ops"] == entry


@pytest.mark.parametrize(
    ("sql", "severity"),
    [
        (f"INSERT INTO {KERNEL} SELECT * FROM {KERNEL}", "info"),  # copies lose nothing
        (f"UPDATE {KERNEL} SET end = start - 1 WHERE rowid = 3", "info"),  # 1 of 636 ops
        (f"UPDATE {KERNEL} SET end = start - 1 WHERE rowid % 5 = 0", "critical"),  # 20%
    ],
)
def test_capture_data_quality_severity(tmp_path: Path, sql: str, severity: str) -> None:
    broken = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(broken, sql)
    got = [f for f in nsysan.analyze(broken).findings if f.code == "CAPTURE_DATA_QUALITY"]
    assert [f.severity for f in got] == [severity]
    assert "CAPTURE_DATA_QUALITY" not in [f.code for f in nsysan.analyze(EXAMPLE).findings]


def test_counts_come_back_from_the_frame_cache(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from nsysan.load import cache

    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    broken = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(broken, f"INSERT INTO {KERNEL} SELECT * FROM {KERNEL} WHERE rowid < 10",
            f"UPDATE {RUNTIME} SET end = start - 1 WHERE rowid = 7")
    first = open_trace(broken, cache_dir=tmp_path / "c", frame_cache=True)
    first.load_all()
    cache.flush()
    second = open_trace(broken, cache_dir=tmp_path / "c", frame_cache=True)
    second.load_all()
    assert second.meta.quality_summary() == first.meta.quality_summary()
    assert second.meta.quality["gpu_ops"]["rules"]["duplicate_row"]["rows"] == 9


# --- real traces ------------------------------------------------------------------------------


@pytest.mark.shared
@pytest.mark.parametrize("rel", shared_files("*/*.sqlite", "*/*.parquetdir"))
def test_real_traces_have_no_impossible_rows(shared_traces: Path, rel: str) -> None:
    """No rule may touch a real export: their late OS-runtime calls (48 ms after the end),
    kernels in flight at the stop, NVTX rows with negative timestamps (thread names and
    domains, not events) and long environment strings are all legitimate."""
    trace = open_trace(shared_traces / rel, frame_cache=False)
    trace.load_all()
    touched = {k: q for k, q in trace.meta.quality_summary().items()
               if q["rules"] or q["notes"]}
    assert touched == {}


def test_twins_equal_but_for_other_columns_keep_the_same_row_whatever_the_order(
    tmp_path: Path,
) -> None:
    # same times and name, another return value: the content decides which is kept
    one, two = _pair(tmp_path, LAYERS)
    twin = (f"INSERT INTO {RUNTIME} SELECT start, end, eventClass, globalTid, correlationId, "
            f"nameId, returnValue + 7, callchainId FROM {RUNTIME} WHERE nameId = {_LAUNCH}")
    execute(one, twin)
    execute(two, f"CREATE TABLE c AS SELECT * FROM {RUNTIME}", f"DELETE FROM {RUNTIME}", twin
            .replace(f"FROM {RUNTIME}", "FROM c"), f"INSERT INTO {RUNTIME} SELECT * FROM c",
            "DROP TABLE c")
    a, b = frames(one)["cuda_api"], frames(two)["cuda_api"]
    assert_frame_equal(a, b)
    assert a.filter(pl.col("return_value") != 0).is_empty()


def test_a_notes_file_without_counts_is_rebuilt(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache file in the former layout (a plain list of notes) or damaged is never trusted
    for counts: the frame is built again from the export."""
    from nsysan.load import cache

    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    broken = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(broken, f"UPDATE {KERNEL} SET end = start - 1 WHERE rowid = 7")
    open_trace(broken, cache_dir=tmp_path / "c", frame_cache=True).frame("gpu_ops")
    cache.flush()
    (notes,) = (tmp_path / "c").rglob("gpu_ops.notes.json")
    notes.write_text("[]")
    again = open_trace(broken, cache_dir=tmp_path / "c", frame_cache=True)
    again.frame("gpu_ops")
    assert again.meta.quality["gpu_ops"]["rules"] == {
        "negative_duration": {"action": "dropped", "rows": 1}}
