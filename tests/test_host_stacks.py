"""The per-sample call-stack summary (`nsysan.load.adapters_stacks`): read through filters
pushed into the export, it must equal the reference reduction of the whole ``cpu_stacks``
frame on every trace and on hostile exports (ties, NULL keys, values of another type,
samples without a leaf, row order), and `read_where` of both sources must return exactly
the rows its filter names."""

from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from conftest import REPO_ROOT, shared_sqlite_files

from nsysan.load import open_trace, sqlite, sqlite_sql
from nsysan.load.adapters_stacks import summary_of_stacks
from nsysan.load.source import Cond
from nsysan.testing.synth import TraceBuilder

LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.535.86.10"
PYTHON = "/usr/bin/python3.10"
DALI = "/opt/dali/libdali_operators.so"
VDSO = "[vdso]"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
RECORDED = REPO_ROOT / "fixtures" / "cpu_host_sampling.sqlite"
COLUMNS = ["id", "stackDepth", "symbol", "module"]


def _summary(path: Path) -> pl.DataFrame:
    """The summary as ``cpu_samples`` carries it (samples with a call chain), by id."""
    samples = open_trace(path, frame_cache=False).frame("cpu_samples")
    return (samples.filter(pl.col("leaf_symbol").is_not_null()
                           | pl.col("stack_layer").is_not_null())
            .select(id="sample_id", leaf_symbol="leaf_symbol", leaf_module="leaf_module",
                    stack_layer="stack_layer").sort("id"))


def _reference(path: Path) -> pl.DataFrame:
    return summary_of_stacks(open_trace(path, frame_cache=False).frame("cpu_stacks")).sort("id")


def _assert_equal(path: Path) -> None:
    got, want = _summary(path), _reference(path)
    assert got.schema == want.schema
    assert got.rows() == want.rows()


def _builder() -> TraceBuilder:
    b = TraceBuilder()
    main = b.add_process(100, "python", main_thread="python")
    worker = b.add_thread(100, 101, "worker")
    b.add_gpu(0)
    b.add_on_cpu(main, 1_000, 50_000, cpu=1)
    b.add_sample(main, 2_000, [("clock_gettime", VDSO), ("cuEventSynchronize", LIBCUDA),
                               ("PyEval", PYTHON)])
    b.add_sample(main, 3_000, [("PyEval", PYTHON)])
    b.add_sample(worker, 4_000, [("read", LIBC), ("memcpy", LIBC), ("Decode", DALI)])
    b.add_sample(worker, 5_000, [("memcpy", LIBC)])  # an OS leaf without a known caller
    b.add_sample(worker, 6_000, [("mystery", "/opt/libmystery.so"), ("PyEval", PYTHON)])
    return b


def _rewrite_callchains(path: Path, rows: list[tuple], constraints: bool = False) -> None:
    """Replace SAMPLING_CALLCHAINS by ``rows`` of (id, symbol, module, stackDepth), in that
    physical order, in a table without NOT NULL or key constraints (a third-party export)."""
    con = sqlite3.connect(path)
    con.execute("DROP TABLE SAMPLING_CALLCHAINS")
    con.execute("CREATE TABLE SAMPLING_CALLCHAINS (id INTEGER, symbol INTEGER, module INTEGER, "
                "kernelMode INTEGER, stackDepth INTEGER"
                + (", PRIMARY KEY (id, stackDepth))" if constraints else ")"))
    con.executemany("INSERT INTO SAMPLING_CALLCHAINS (id, symbol, module, stackDepth) "
                    "VALUES (?, ?, ?, ?)", rows)
    con.commit()
    con.close()


def _chains(path: Path) -> tuple[list[tuple], dict[str, int]]:
    con = sqlite3.connect(path)
    rows = con.execute("SELECT id, symbol, module, stackDepth FROM SAMPLING_CALLCHAINS").fetchall()
    ids = dict(con.execute("SELECT value, id FROM StringIds").fetchall())
    con.close()
    return rows, ids


def test_planted_summary(tmp_path: Path) -> None:
    path = _builder().write(tmp_path / "t.sqlite")
    got = _summary(path)
    assert got.select("leaf_symbol", "stack_layer").rows() == [
        ("clock_gettime", "runtime_driver"), ("PyEval", "framework"),
        ("read", "data_pipeline"), ("memcpy", "os"), ("mystery", "unknown")]
    _assert_equal(path)


def test_callers_deeper_than_the_first_read_equal_the_reference(tmp_path: Path) -> None:
    """The callers of OS leaves are read in two steps (`adapters_stacks.NEAR_CALLERS` first,
    then deeper frames of the samples still without a known caller): a known caller at
    depth 1, 2, 3 or 6, behind unknown and OS frames, and ties at a deep depth, give what
    one read of every frame gives."""
    from nsysan.load.adapters_stacks import NEAR_CALLERS

    assert max(NEAR_CALLERS) < 3
    b = TraceBuilder()
    main = b.add_process(100, "python", main_thread="python")
    b.add_gpu(0)
    mystery = "/opt/libmystery.so"
    b.add_sample(main, 1_000, [("read", LIBC), ("PyEval", PYTHON)])
    b.add_sample(main, 2_000, [("read", LIBC), ("memcpy", LIBC), ("Decode", DALI)])
    b.add_sample(main, 3_000, [("read", LIBC), ("m", mystery), ("n", mystery),
                               ("Decode", DALI), ("PyEval", PYTHON)])
    b.add_sample(main, 4_000, [("read", LIBC), ("a", LIBC), ("b", VDSO), ("c", LIBC),
                               ("d", LIBC), ("e", mystery), ("cuLaunch", LIBCUDA)])
    b.add_sample(main, 5_000, [("read", LIBC), ("a", LIBC), ("b", LIBC), ("c", LIBC)])
    path = b.write(tmp_path / "t.sqlite")
    got = _summary(path)
    assert got["stack_layer"].to_list() == [
        "framework", "data_pipeline", "data_pipeline", "runtime_driver", "os"]
    _assert_equal(path)
    rows, ids = _chains(path)
    deep = next(r for r in rows if r[2] == ids[LIBCUDA])
    tie = (deep[0], ids["Decode"], ids[DALI], deep[3])  # same depth: the text decides
    _rewrite_callchains(path, [*rows, tie])
    _assert_equal(path)


def test_ties_nulls_and_missing_leaves_equal_the_reference(tmp_path: Path) -> None:
    path = _builder().write(tmp_path / "t.sqlite")
    rows, ids = _chains(path)
    s = ids["memcpy"]
    extra = [
        (rows[0][0], ids["PyEval"], ids[PYTHON], 0),  # a second leaf: the text decides
        (rows[0][0], ids["Decode"], ids[DALI], 1),  # a second caller at depth 1: text again
        (None, s, ids[LIBC], 0),  # NULL keys: dropped and counted
        (rows[-1][0], s, ids[LIBC], None),
        (999, s, ids[LIBC], 2),  # a chain without a leaf frame
    ]
    shuffled = rows + extra
    random.Random(7).shuffle(shuffled)
    _rewrite_callchains(path, shuffled)
    _assert_equal(path)
    trace = open_trace(path, frame_cache=False)
    trace.frame("cpu_samples")
    quality = trace.meta.quality["cpu_stacks"]
    assert quality["rules"]["missing_timestamp"]["rows"] == 2
    assert quality["rows"] == len(shuffled) - 2
    # the reference, built on purpose afterwards, records the same entry
    trace.frame("cpu_stacks")
    assert trace.meta.quality["cpu_stacks"] == quality


def test_values_of_another_type_take_the_reference_path(tmp_path: Path) -> None:
    path = _builder().write(tmp_path / "t.sqlite")
    rows, _ = _chains(path)
    bad = [(r[0], "not-a-symbol", r[2], r[3]) if r[3] == 0 and i == 0 else r
           for i, r in enumerate(rows)]
    _rewrite_callchains(path, bad)
    _assert_equal(path)
    trace = open_trace(path, frame_cache=False)
    trace.frame("cpu_samples")
    rules = trace.meta.quality["cpu_stacks"]["rules"]
    assert rules["value_not_integer"]["columns"] == {"SAMPLING_CALLCHAINS.symbol": 1}


def test_a_source_that_cannot_filter_takes_the_reference_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _builder().write(tmp_path / "t.sqlite")
    want = _summary(path)
    monkeypatch.delattr(sqlite.SqliteSource, "read_where")
    assert _summary(path).rows() == want.rows()


def test_no_adbc_gives_the_same_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _builder().write(tmp_path / "t.sqlite")
    want = _summary(path)
    monkeypatch.setenv("NSYSAN_NO_ADBC", "1")
    assert _summary(path).rows() == want.rows()


def test_recorded_fixture_summary_equals_the_reference() -> None:
    _assert_equal(RECORDED)


@pytest.mark.shared
@pytest.mark.parametrize("name", [n for n in shared_sqlite_files()
                                  if "sc22" in n or "sc23" in n or "aiprofiler" in n
                                  or "jacobi" in n or "pipit" in n])
def test_shared_traces_summary_equals_the_reference(shared_traces: Path, name: str) -> None:
    path = shared_traces / name
    if not open_trace(path, frame_cache=False).meta.tables.get("SAMPLING_CALLCHAINS"):
        pytest.skip("no call chains")
    _assert_equal(path)


@pytest.mark.shared
def test_parquetdir_summary_equals_sqlite(shared_traces: Path) -> None:
    sq = shared_traces / "sc23-vit-train-nvtx" / "4workers.nsys-rep.nsys2023.4.4.sqlite"
    pq = shared_traces / "sc23-vit-train-nvtx" / "4workers.nsys2023.4.4.parquetdir"
    assert _summary(pq).rows() == _summary(sq).rows()


# --- read_where ------------------------------------------------------------------------------
def _brute(rows: list[tuple], where) -> list[tuple]:
    def ok(row: dict, c: Cond) -> bool:
        v = row[c.column]
        if c.op == "is_null":
            return v is None
        if v is None:
            return False
        return v in c.value if c.op == "in" else v == c.value if c.op == "==" else v > c.value

    named = [dict(zip(["id", "symbol", "module", "stackDepth"], r, strict=True)) for r in rows]
    return [tuple(r[c] for c in COLUMNS) for r in named
            if any(all(ok(r, c) for c in alt) for alt in where)]


def _key(row: tuple) -> tuple:
    return tuple((v is not None, v or 0) for v in row)


@pytest.mark.parametrize("where", [
    ((Cond("stackDepth", "==", 0),),),
    ((Cond("stackDepth", "==", 0),), (Cond("id", "is_null"),), (Cond("stackDepth", "is_null"),)),
    ((Cond("id", "in", [1, 3, 5, 999]), Cond("stackDepth", ">", 0)),),
    ((Cond("id", "in", []),),),
    (),
])
def test_read_where_returns_exactly_the_matching_rows(
        tmp_path: Path, where, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_sql, "IN_CHUNK", 2)  # several statements for one in-list
    path = _builder().write(tmp_path / "t.sqlite")
    rows, _ = _chains(path)
    rows = [*rows, (None, 1, 1, 0), (3, 2, 2, None)]
    _rewrite_callchains(path, rows)
    source = sqlite.SqliteSource(path)
    got = source.read_where("SAMPLING_CALLCHAINS", COLUMNS, where)
    assert got.schema == dict.fromkeys(COLUMNS, pl.Int64())
    assert sorted(got.rows(), key=_key) == sorted(_brute(rows, where), key=_key)
    source.close()


@pytest.mark.parametrize("expected", [None, 1, 4, 10_000])
@pytest.mark.parametrize("where", [
    ((Cond("stackDepth", "==", 0),),),
    ((Cond("stackDepth", "==", 0),), (Cond("id", "is_null"),), (Cond("stackDepth", "is_null"),)),
    ((Cond("id", "in", [1, 3, 5, 999]), Cond("stackDepth", ">", 0)),),
])
def test_a_big_read_into_sized_buffers_returns_the_same_rows(
        tmp_path: Path, where, expected: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read of a big table through pyarrow's reader, batch by batch into buffers sized
    for ``expected_rows`` (too few: they grow; too many: cut to size), returns the rows (NULL
    keys included) that the plain read returns."""
    monkeypatch.setattr(sqlite, "FILTERED_ARROW_MIN_ROWS", 0)  # every table counts as big
    monkeypatch.setattr(sqlite.sqlite_bulk, "BATCH_ROWS", 3)
    path = _builder().write(tmp_path / "t.sqlite")
    rows, _ = _chains(path)
    _rewrite_callchains(path, [*rows, (None, 1, 1, 0), (3, 2, 2, None)])
    filled = []
    read_numbers = sqlite.sqlite_bulk.read_numbers
    monkeypatch.setattr(sqlite.sqlite_bulk, "read_numbers",
                        lambda *a: filled.append(a[-1]) or read_numbers(*a))
    source = sqlite.SqliteSource(path)
    got = source.read_where("SAMPLING_CALLCHAINS", COLUMNS, where, expected_rows=expected)
    assert filled == ([] if expected is None else [expected])  # (not the row path)
    assert got.schema == dict.fromkeys(COLUMNS, pl.Int64())
    assert sorted(got.rows(), key=_key) == sorted(_brute(
        [*rows, (None, 1, 1, 0), (3, 2, 2, None)], where), key=_key)
    source.close()


@pytest.mark.shared
def test_parquetdir_read_where_equals_sqlite(shared_traces: Path) -> None:
    from nsysan.load.parquetdir import ParquetDirSource

    sq = sqlite.SqliteSource(
        shared_traces / "sc23-vit-train-nvtx" / "4workers.nsys-rep.nsys2023.4.4.sqlite")
    vit = shared_traces / "sc23-vit-train-nvtx"
    pq = ParquetDirSource(vit / "4workers.nsys2023.4.4.parquetdir")
    where = ((Cond("id", "in", list(range(0, 5000, 7))), Cond("stackDepth", ">", 2)),
             (Cond("stackDepth", "==", 0), Cond("id", "in", [11, 12, 13])))
    a = sq.read_where("SAMPLING_CALLCHAINS", COLUMNS, where).sort(COLUMNS)
    b = pq.read_where("SAMPLING_CALLCHAINS", COLUMNS, where).sort(COLUMNS)
    assert a.height > 100 and a.equals(b)
    assert sq.not_null("SAMPLING_CALLCHAINS") >= {"id", "stackDepth"}
    assert pq.not_null("SAMPLING_CALLCHAINS") == set()
    sq.close()


def test_shuffled_callchains_give_the_same_summary(tmp_path: Path) -> None:
    path = _builder().write(tmp_path / "t.sqlite")
    want = _summary(path).rows()
    rows, _ = _chains(path)
    random.Random(3).shuffle(rows)
    other = tmp_path / "shuffled.sqlite"
    shutil.copy(path, other)
    _rewrite_callchains(other, rows, constraints=True)
    assert _summary(other).rows() == want


@pytest.mark.parametrize("order", ["increasing", "shuffled", "duplicated"])
def test_samples_take_their_summary_row_as_a_left_join_would(order: str) -> None:
    """`_with_summary` (a binary search when the summary's ids increase, else a join) gives
    exactly the left join on ``id``: samples without a call chain get nulls, a summary row
    without a sample is dropped, the samples keep their order."""
    from nsysan.load.adapters_samples import _with_summary

    rng = random.Random(7)
    ids = list(range(1, 400))
    keys = sorted(rng.sample(range(-5, 420), 200))  # some ids no sample has, some missing
    if order == "shuffled":
        rng.shuffle(keys)
    elif order == "duplicated":  # a join repeats the sample for each match
        keys = sorted([*keys, keys[10], keys[50]])
    samples = pl.DataFrame({"id": [*rng.sample(ids, len(ids)), 7, 7],
                            "time": list(range(len(ids) + 2))})
    summary = pl.DataFrame({
        "id": keys,
        "leaf_symbol": pl.Series([f"s{k % 13}" for k in keys], dtype=pl.Categorical),
        "stack_layer": pl.Series(["os" if k % 3 else None for k in keys]),
    })
    got = _with_summary(samples, summary)
    want = samples.join(summary, on="id", how="left", maintain_order="left")
    assert got.equals(want)
    assert got.schema == want.schema
