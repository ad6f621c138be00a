"""Broken copies of nsys SQLite exports, for the data-quality tests and the fuzz suite.

An export is copied into a temporary directory and then changed with SQL, the way a damaged
file, a third-party slicer or an attacker would change it. Nothing here knows nsysan's rules:
the tests compare nsysan's frames of the broken copy with those of a copy repaired by hand.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl
from polars.testing import assert_frame_equal

from nsysan.frames import schemas
from nsysan.load import open_trace

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "fixtures" / "example_ddp.sqlite"
LAYERS = ROOT / "fixtures" / "example_layers.sqlite"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
#: canonical frames compared by `assert_same_frames` (meta holds the raw tables' row counts)
COMPARED = [f for f in schemas.CANONICAL if f != "meta"]


def copy_export(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    dst.chmod(0o644)  # the shared traces are read-only
    return dst


def execute(path: Path, *statements: str, params: tuple = ()) -> None:
    """Run ``statements`` and commit; ``params`` bind the ``?`` of every statement."""
    con = sqlite3.connect(path)
    try:
        for sql in statements:
            con.execute(sql, params) if params else con.execute(sql)
        con.commit()
    finally:
        con.close()


def query(path: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def declared(path: Path, table: str) -> list[tuple[str, str]]:
    """(column, declared type) of ``table`` in order."""
    return [(r[1], r[2]) for r in query(path, f'PRAGMA table_info("{table}")')]


def relax(path: Path, table: str, types: dict[str, str] | None = None) -> None:
    """Recreate ``table`` without NOT NULL and keys (a third-party export may have none), with
    the same rows and rowids; ``types`` redeclares columns (``{"start": "TEXT"}``, ``""``:
    none)."""
    cols = declared(path, table)
    decl = ", ".join(f'"{c}" {(types or {}).get(c, t)}' for c, t in cols)
    names = ", ".join(f'"{c}"' for c, _ in cols)
    execute(
        path,
        f'CREATE TABLE "_relaxed" ({decl})',
        f'INSERT INTO "_relaxed" (rowid, {names}) SELECT rowid, {names} FROM "{table}" '
        "ORDER BY rowid",
        f'DROP TABLE "{table}"',
        f'ALTER TABLE "_relaxed" RENAME TO "{table}"',
    )


def frames(path: Path) -> dict[str, pl.DataFrame]:
    trace = open_trace(path, trace_id="t", frame_cache=False)
    return {name: trace.frame(name) for name in COMPARED}


def quality(path: Path) -> dict[str, dict[str, int]]:
    """frame -> rule -> rows of the export at ``path`` (every frame loaded)."""
    trace = open_trace(path, trace_id="t", frame_cache=False)
    trace.load_all()
    return {frame: {rule: e["rows"] for rule, e in q["rules"].items()}
            for frame, q in trace.meta.quality_summary().items() if q["rules"]}


def assert_same_frames(a: Path, b: Path) -> None:
    fa, fb = frames(a), frames(b)
    for name in COMPARED:
        try:
            assert_frame_equal(fa[name], fb[name])
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
