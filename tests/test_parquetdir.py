"""ParquetDirSource: the TableSource over `nsys export --type parquetdir` directories.

Synthetic directories pin the dtype normalisation and every bad-input error; the real 2023.4.4
exports pin that each raw table equals, value for value, the SQLite export of the same report.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from nsysan.errors import NsysanError, SchemaError, TraceFormatError
from nsysan.load.parquetdir import ParquetDirSource, is_parquetdir
from nsysan.load.sqlite import SqliteSource

BIG = 2**64 - 5  # a uint64 beyond Int64: SQLite stores it as its two's complement, -5


def _write_export(root: Path, tables: dict[str, pl.DataFrame]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.write_parquet(root / f"{name}.parquet")
    return root


def _string_ids() -> pl.DataFrame:
    return pl.DataFrame({"id": pl.Series([1, 2], dtype=pl.Int32), "value": ["sgemm", "nccl"]})


@pytest.fixture
def export(tmp_path: Path) -> Path:
    """A tiny parquetdir using every Arrow type the nsys exporter writes."""
    kernel = pl.DataFrame(
        {
            "start": pl.Series([30, 10, 20], dtype=pl.Int64),
            "end": pl.Series([35, 15, None], dtype=pl.Int64),
            "globalPid": pl.Series([BIG, 7, None], dtype=pl.UInt64),
            "contextId": pl.Series([1, 1, 2], dtype=pl.UInt32),
            "gridX": pl.Series([1, 2, 3], dtype=pl.Int32),
            "isFlag": pl.Series([True, False, None], dtype=pl.Boolean),
            "ratio": pl.Series([0.5, 0.25, None], dtype=pl.Float32),
            "label": pl.Series(["a", "b", "a"], dtype=pl.Categorical),
            "text": pl.Series(["x", None, "z"], dtype=pl.String),
            "blob": pl.Series([b"\x00", b"", None], dtype=pl.Binary),
        }
    )
    return _write_export(
        tmp_path / "run.parquetdir",
        {"StringIds": _string_ids(), "CUPTI_ACTIVITY_KIND_KERNEL": kernel},
    )


# --- the TableSource protocol -----------------------------------------------------------------


def test_tables_columns_and_counts_from_metadata(export: Path) -> None:
    src = ParquetDirSource(export)
    assert src.format == "parquetdir"
    assert src.path == export
    assert src.tables() == {"CUPTI_ACTIVITY_KIND_KERNEL": 3, "StringIds": 2}
    assert src.columns("CUPTI_ACTIVITY_KIND_KERNEL")[:3] == ["start", "end", "globalPid"]
    assert src.columns("NVTX_EVENTS") == []  # absent table: empty, never an error
    src.close()


@pytest.mark.parametrize(
    ("column", "dtype", "values"),
    [
        ("start", pl.Int64, [30, 10, 20]),
        ("end", pl.Int64, [35, 15, None]),
        # bit-for-bit like SQLite's signed storage, not a failing numeric cast
        ("globalPid", pl.Int64, [BIG - 2**64, 7, None]),
        ("contextId", pl.Int64, [1, 1, 2]),
        ("gridX", pl.Int64, [1, 2, 3]),
        ("isFlag", pl.Int64, [1, 0, None]),  # SQLite has no booleans: 0/1 integers
        ("ratio", pl.Float64, [0.5, 0.25, None]),  # SQLite REAL is a double
        ("label", pl.String, ["a", "b", "a"]),  # dictionary-encoded text
        ("text", pl.String, ["x", None, "z"]),
        ("blob", pl.Binary, [b"\x00", b"", None]),
    ],
)
def test_read_normalises_to_sqlite_dtypes(
    export: Path, column: str, dtype: pl.DataType, values: list
) -> None:
    got = ParquetDirSource(export).read("CUPTI_ACTIVITY_KIND_KERNEL", [column])
    assert got.schema == pl.Schema({column: dtype})
    assert got[column].to_list() == values  # export (file) row order, not sorted


def test_read_projects_in_requested_order(export: Path) -> None:
    got = ParquetDirSource(export).read("CUPTI_ACTIVITY_KIND_KERNEL", ["text", "start"])
    assert got.columns == ["text", "start"]
    assert ParquetDirSource(export).read("StringIds", []).shape == (0, 0)


def test_scan_pushes_projection_and_predicates_into_the_parquet_scan(export: Path) -> None:
    lf = ParquetDirSource(export).scan("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "end"])
    plan = lf.filter(pl.col("start") > 15).explain()
    assert "PROJECT 2/10 COLUMNS" in plan
    assert 'SELECTION: [(col("start")) > (15)]' in plan or 'SELECTION: col("start") > 15' in plan
    assert lf.filter(pl.col("start") > 15).collect()["start"].to_list() == [30, 20]


@pytest.mark.parametrize(
    ("table", "columns", "message"),
    [
        ("NVTX_EVENTS", ["start"], "table NVTX_EVENTS not found in"),
        ("CUPTI_ACTIVITY_KIND_KERNEL", ["start", "nope"], "has no column nope"),
    ],
)
def test_read_of_absent_table_or_column_is_a_schema_error(
    export: Path, table: str, columns: list[str], message: str
) -> None:
    with pytest.raises(SchemaError, match=message) as err:
        ParquetDirSource(export).read(table, columns)
    assert "\n" not in str(err.value)


def test_is_parquetdir(export: Path, tmp_path: Path) -> None:
    assert is_parquetdir(export)
    assert not is_parquetdir(export / "StringIds.parquet")
    (tmp_path / "empty").mkdir()
    assert not is_parquetdir(tmp_path / "empty")
    assert not is_parquetdir(_bad_foreign_parquet(tmp_path))  # nsysan's own output dir
    assert not is_parquetdir(tmp_path / "missing")


def test_ignores_files_that_are_not_tables(export: Path) -> None:
    (export / "README.txt").write_text("notes")
    (export / "sub").mkdir()
    (export / ".hidden.parquet").write_bytes(b"junk")  # not a table name: never opened
    assert set(ParquetDirSource(export).tables()) == {"CUPTI_ACTIVITY_KIND_KERNEL", "StringIds"}


# --- bad inputs: one-line TraceFormatError --------------------------------------------------


def _bad_missing(tmp: Path) -> Path:
    return tmp / "does-not-exist"


def _bad_file(tmp: Path) -> Path:
    (tmp / "x.parquet").write_bytes(b"PAR1")
    return tmp / "x.parquet"


def _bad_empty(tmp: Path) -> Path:
    (tmp / "empty").mkdir()
    return tmp / "empty"


def _bad_no_parquet(tmp: Path) -> Path:
    (tmp / "d").mkdir()
    (tmp / "d" / "report.sqlite").write_bytes(b"")
    return tmp / "d"


def _bad_foreign_parquet(tmp: Path) -> Path:
    # e.g. nsysan's own output directory passed as a trace
    gaps = pl.DataFrame({"trace_id": ["t"], "start_ns": [1], "end_ns": [2]})
    return _write_export(tmp / "out", {"gaps": gaps, "gap_summary": gaps})


def _bad_strings_only(tmp: Path) -> Path:
    # StringIds alone is not enough: the same marker-table rule as for SQLite exports
    return _write_export(tmp / "d", {"StringIds": _string_ids()})


def _bad_corrupt_table(tmp: Path) -> Path:
    root = _bad_strings_only(tmp)
    (root / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").write_bytes(b"not parquet at all")
    return root


def _bad_truncated_table(tmp: Path) -> Path:
    root = _bad_strings_only(tmp)
    good = (root / "StringIds.parquet").read_bytes()
    (root / "NVTX_EVENTS.parquet").write_bytes(good[: len(good) // 2])
    return root


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_bad_missing, "no such file or directory"),
        (_bad_file, "not a directory"),
        (_bad_empty, "directory is empty; re-export the report with `nsys export --type parq"),
        (_bad_no_parquet, r"no <TABLE>.parquet files in this directory"),
        (_bad_foreign_parquet, "is a Parquet directory but not an Nsight Systems export"),
        (_bad_strings_only, "is a Parquet directory but not an Nsight Systems export"),
        (_bad_corrupt_table, "CUPTI_ACTIVITY_KIND_KERNEL.parquet: corrupt Parquet file"),
        (_bad_truncated_table, "NVTX_EVENTS.parquet: corrupt Parquet file"),
    ],
    ids=lambda v: getattr(v, "__name__", "")[5:] or None,
)
def test_bad_inputs_raise_one_line_trace_format_errors(tmp_path: Path, make, message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(TraceFormatError, match=message) as err:
        ParquetDirSource(path)
    text = str(err.value)
    assert "\n" not in text
    assert str(path) in text or path.name in text
    assert isinstance(err.value, NsysanError)


# --- real exports: every raw table equals the SQLite export of the same report ----------------

#: rows of META_DATA_EXPORT that describe the export run (when, where to, with which flags),
#: not the capture: they differ between two exports of one report by construction
_EXPORT_RUN_KEYS = pl.col("name").str.starts_with("EXPORT_TIME") | pl.col("name").str.starts_with(
    "EXPORT_PARAM_"
)
#: tables the 2023.4.4 SQLite export writes and its parquetdir export does not
_SQLITE_ONLY = {"META_DATA_CAPTURE", "CUPTI_ACTIVITY_KIND_CUDA_EVENT"}

PAIRS = [
    pytest.param(
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2023.4.4.sqlite",
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys2023.4.4.parquetdir",
        id="sc22",
    ),
    pytest.param(
        "sc23-vit-train-nvtx/4workers.nsys-rep.nsys2023.4.4.sqlite",
        "sc23-vit-train-nvtx/4workers.nsys2023.4.4.parquetdir",
        id="vit",
    ),
]


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize(("sqlite_rel", "pq_rel"), PAIRS)
def test_raw_tables_equal_the_sqlite_export(
    shared_traces: Path, sqlite_rel: str, pq_rel: str
) -> None:
    """What the adapters see: `SqliteSource.read` and `ParquetDirSource.read` agree exactly,
    dtypes included, on every table both exports have."""
    src = ParquetDirSource(shared_traces / pq_rel)
    with SqliteSource(shared_traces / sqlite_rel) as ref:
        assert set(src.tables()) == set(ref.tables()) - _SQLITE_ONLY
        for table, n_rows in src.tables().items():
            assert n_rows == ref.tables()[table], table
            assert src.columns(table) == ref.columns(table), table
            got = src.read(table, src.columns(table))
            expected = ref.read(table, ref.columns(table))
            if table == "META_DATA_EXPORT":
                got, expected = got.filter(~_EXPORT_RUN_KEYS), expected.filter(~_EXPORT_RUN_KEYS)
            try:
                assert_frame_equal(got, expected, check_dtypes=True)
            except AssertionError as exc:
                raise AssertionError(f"{table}: {exc}") from None


def test_corrupt_data_pages_behind_a_valid_footer_fail_on_read(tmp_path: Path) -> None:
    root = _bad_strings_only(tmp_path)
    table = root / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    pl.DataFrame({"start": range(100_000)}).write_parquet(table)
    data = bytearray(table.read_bytes())
    for i in range(100, 2000):  # inside the first data page; the footer stays valid
        data[i] ^= 0x5A
    table.write_bytes(bytes(data))
    src = ParquetDirSource(root)
    assert src.tables()["CUPTI_ACTIVITY_KIND_KERNEL"] == 100_000  # footer only: fine
    with pytest.raises(TraceFormatError, match="corrupt Parquet file while reading") as err:
        src.read("CUPTI_ACTIVITY_KIND_KERNEL", ["start"])
    assert "\n" not in str(err.value)


# --- bad inputs through open_trace and the CLI: same one-line errors as SQLite ------------------

BAD_DIRS = [
    _bad_empty,
    _bad_no_parquet,
    _bad_foreign_parquet,
    _bad_strings_only,
    _bad_corrupt_table,
    _bad_truncated_table,
]


@pytest.mark.parametrize("make", BAD_DIRS, ids=lambda f: f.__name__[5:])
def test_open_trace_rejects_bad_parquetdirs(tmp_path: Path, make) -> None:
    from nsysan.load import open_trace

    path = make(tmp_path)
    with pytest.raises(TraceFormatError) as err:
        open_trace(path)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("command", ["schema", "analyze"])
@pytest.mark.parametrize("make", BAD_DIRS, ids=lambda f: f.__name__[5:])
def test_cli_on_bad_parquetdir_is_one_error_line(tmp_path: Path, make, command: str) -> None:
    from click.testing import CliRunner

    from nsysan.cli import cli

    args = [command, str(make(tmp_path))]
    if command == "analyze":
        args += ["-o", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output


def test_cli_schema_reads_a_parquetdir(export: Path) -> None:
    from click.testing import CliRunner

    from nsysan.cli import cli

    result = CliRunner().invoke(cli, ["schema", str(export)])
    assert result.exit_code == 0, result.output
    assert "source:    parquetdir" in result.output
    assert "CUPTI_ACTIVITY_KIND_KERNEL  3" in result.output


#: raw tables removed from both forms of the ViT capture, and what must happen then
DROPPED = {
    "no-kernel-table": ("CUPTI_ACTIVITY_KIND_KERNEL",),
    "no-cuda-tables": (
        "CUPTI_ACTIVITY_KIND_KERNEL",
        "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET",
        "CUPTI_ACTIVITY_KIND_RUNTIME",
    ),
}


def _without(shared_traces: Path, tmp: Path, drop: tuple[str, ...]) -> tuple[Path, Path]:
    """The ViT capture as SQLite and as parquetdir, both without the ``drop`` tables."""
    vit = shared_traces / "sc23-vit-train-nvtx"
    pq_dir = tmp / "vit.nsys2023.4.4.parquetdir"
    pq_dir.mkdir()
    for f in (vit / "4workers.nsys2023.4.4.parquetdir").glob("*.parquet"):
        if f.stem not in drop:
            (pq_dir / f.name).symlink_to(f)
    db = tmp / "vit.nsys2023.4.4.sqlite"
    shutil.copyfile(vit / "4workers.nsys-rep.nsys2023.4.4.sqlite", db)
    con = sqlite3.connect(db)
    for table in drop:
        con.execute(f'DROP TABLE "{table}"')
    con.commit()
    con.close()
    return db, pq_dir


def _outcome(fn, path: Path):
    """What ``fn(path)`` did, comparable across forms: the error (type, message with the path
    replaced) or the value."""
    try:
        return "ok", fn(path)
    except NsysanError as exc:
        return type(exc).__name__, str(exc).replace(str(path), "<trace>")


@pytest.mark.shared
@pytest.mark.slow
@pytest.mark.parametrize("case", list(DROPPED))
def test_missing_tables_behave_as_in_sqlite(shared_traces: Path, tmp_path: Path, case: str) -> None:
    from nsysan.api import analyze
    from nsysan.load import open_trace

    db, pq_dir = _without(shared_traces, tmp_path, DROPPED[case])

    def opened(path: Path):
        meta = open_trace(path).meta
        return meta.missing, meta.notes

    def analyzed(path: Path):
        return {n: _canonical_rows(t) for n, t in analyze(path, findings=False).tables.items()}

    for fn in (opened, analyzed):
        assert _outcome(fn, pq_dir) == _outcome(fn, db), fn.__name__
    if case == "no-kernel-table":  # a lazy export: noted, never a crash
        _, notes = opened(pq_dir)
        assert any("CUPTI_ACTIVITY_KIND_KERNEL not found" in n for n in notes)
    else:  # nothing CUDA at all: analyze refuses with one line naming the tables
        kind, message = _outcome(analyzed, pq_dir)
        assert kind == "SchemaError" and "CUPTI_ACTIVITY_KIND_KERNEL" in message
        assert "\n" not in message


def _canonical_rows(df: pl.DataFrame) -> tuple[pl.Schema, str]:
    """A table as comparable plain data (schema, CSV text) without trace_id, rows sorted."""
    df = df.drop("trace_id", strict=False)
    df = df.sort(df.columns, nulls_last=True) if df.width else df
    return df.schema, df.write_csv()
