"""Fuzz suite: hypothesis mutations of real exports (issue 16).

Each example copies an export (two project fixtures and, when present, a small real export of
schema 2.9.1) and breaks it with SQL: rows deleted, copied, shuffled or given NULL, text, real,
blob, huge and negative values, tables dropped or written twice, columns dropped or declared
with another type, StringIds ids doubled, launch calls given nested twins. For every mutation
either nsysan reads the export, its frames equal those of the same export repaired by an
independent oracle (`repair`: the rules of docs/data-quality.md written out here row by row in
plain Python) and every repaired row is counted, or it refuses with one `NsysanError`; through
the CLI, exit 0 with complete outputs or exit 1 with one ``Error:`` line, never a traceback, a
partial output or a change outside the output folder.

Reproducible in CI: ``derandomize=True``, and a bounded number of examples
(``NSYSAN_FUZZ_EXAMPLES`` raises it for a long local run).
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SHARED_TRACES, unavailable
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
    declared,
    execute,
    query,
    relax,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nsysan.cli import cli
from nsysan.errors import NsysanError
from nsysan.load import open_trace

OSRT, OVERHEAD, NVTX = "OSRT_API", "PROFILER_OVERHEAD", "NVTX_EVENTS"
REAL_EXPORT = SHARED_TRACES / "dlprof-pyprof-nvtx" / "nsys_profile.sqlite"
EXAMPLES = int(os.environ.get("NSYSAN_FUZZ_EXAMPLES", "25"))
INT64_MAX = (1 << 63) - 1

#: event table -> (frame, the integer columns the adapter reads, its text columns)
TABLES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    KERNEL: ("gpu_ops", ("start", "end", "deviceId", "streamId", "shortName", "gridX", "gridY",
                         "gridZ", "blockX", "blockY", "blockZ", "graphNodeId", "contextId",
                         "correlationId", "globalPid", "demangledName"), ()),
    MEMCPY: ("gpu_ops", ("start", "end", "deviceId", "streamId", "copyKind", "srcKind",
                         "dstKind", "graphNodeId", "contextId", "correlationId", "globalPid",
                         "bytes"), ()),
    MEMSET: ("gpu_ops", ("start", "end", "deviceId", "streamId", "memKind", "graphNodeId",
                         "contextId", "correlationId", "globalPid", "bytes"), ()),
    RUNTIME: ("cuda_api", ("start", "end", "globalTid", "nameId", "eventClass", "returnValue",
                           "correlationId"), ()),
    SYNC: ("sync", ("start", "end", "deviceId", "streamId", "syncType", "contextId",
                    "correlationId", "globalPid"), ()),
    OSRT: ("osrt", ("start", "end", "globalTid", "nameId", "eventClass"), ()),
    OVERHEAD: ("overhead", ("start", "end", "globalTid", "nameId"), ()),
    NVTX: ("nvtx", ("start", "end", "eventType", "globalTid", "textId", "endGlobalTid",
                    "domainId", "category", "jsonTextId", "eventId"), ("text", "jsonText")),
}
#: columns whose absence is an error (docs/data-quality.md "Minimal exports")
REQUIRED = {
    KERNEL: {"start", "end", "deviceId", "streamId", "shortName"},
    MEMCPY: {"start", "end", "deviceId", "streamId", "copyKind"},
    MEMSET: {"start", "end", "deviceId", "streamId"},
    RUNTIME: {"start", "end", "globalTid", "nameId"},
    SYNC: {"start", "end", "deviceId", "streamId"},
    OSRT: {"start", "end", "globalTid", "nameId"},
    OVERHEAD: {"start", "end", "globalTid", "nameId"},
    NVTX: {"start", "end", "eventType", "globalTid"},
}
NVTX_EVENT_TYPES = {59: "push_pop", 70: "push_pop", 60: "start_end", 71: "start_end",
                    34: "mark"}
STRANGE_VALUES = [None, "abc", 1.5, b"\x00\x01", 10**15, INT64_MAX, -(1 << 63),
                  -5_000_000_000, -1, 0]


# --- the oracle -------------------------------------------------------------------------------


def as_int(value: object) -> int | None:
    """A stored value as the adapters read an integer column: integers, integral reals and
    integer text (a column redeclared TEXT stores its integers so) keep their value; the
    rest is NULL."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(1 << 63) <= value < 1 << 63 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2.0**63 else None
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        number = int(value)
        return number if -(1 << 63) <= number < 1 << 63 else None
    return None


@dataclass
class Repair:
    """What the oracle found in one export: the repaired copy, the expected counts."""

    counts: Counter = field(default_factory=Counter)  # (frame, rule) -> rows
    drop: dict[str, set[int]] = field(default_factory=dict)  # table -> rowids
    nulled: dict[str, dict[int, set[str]]] = field(default_factory=dict)  # table -> row -> cols
    error: bool = False  # a needed column is absent: nsysan must refuse


def _rows(path: Path, table: str) -> list[dict]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return [dict(r) for r in con.execute(f'SELECT rowid AS _rowid, * FROM "{table}"')]
    finally:
        con.close()


def repair(path: Path) -> Repair:
    """The data-quality rules applied by hand to the export at ``path``."""
    out = Repair()
    tables = {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    duration = query(path, "SELECT max(duration) FROM ANALYSIS_DETAILS")[0][0]
    slack = max(duration, 1_000_000_000)
    lo, hi = -slack, duration + slack
    names = _strings(path, out) if "StringIds" in tables else {}
    events: dict[str, list[tuple[str, dict]]] = {}
    for table, (frame, ints, texts) in TABLES.items():
        if table not in tables:
            continue
        columns = [c for c, _ in declared(path, table)]
        if not REQUIRED[table] <= set(columns):
            out.error = True
            return out
        for row in _rows(path, table):
            typed = {"_rowid": row["_rowid"]}
            for c in ints:
                if c in row:
                    typed[c] = as_int(row[c])
                    if row[c] is not None and typed[c] is None:
                        out.nulled.setdefault(table, {}).setdefault(row["_rowid"], set()).add(c)
                        out.counts[frame, "value_not_integer"] += 1
                else:
                    typed[c] = None
            for c in texts:
                typed[c] = row.get(c) if isinstance(row.get(c), str) else None
            if table == OSRT and typed["eventClass"] not in (None, 27):
                continue
            if table == NVTX and typed["eventType"] not in NVTX_EVENT_TYPES:
                continue
            events.setdefault(frame, []).append((table, typed))
    for frame, rows in events.items():
        kept = _impossible(out, frame, rows, lo, hi)
        kept = _copies(out, frame, kept)
        if frame == "cuda_api":
            _twins(out, kept, names)
    return out


def _strings(path: Path, out: Repair) -> dict[int, str]:
    seen: dict[int, set[str]] = {}
    for row in _rows(path, "StringIds"):
        sid = as_int(row["id"])
        if sid is None:
            out.counts["strings", "missing_string_id"] += 1
            out.counts["strings", "value_not_integer"] += row["id"] is not None
            continue
        value = row["value"] if isinstance(row["value"], str) else None
        values = seen.setdefault(sid, set())
        if value in values:
            out.counts["strings", "duplicate_row"] += 1
        values.add(value)  # type: ignore[arg-type]
    names = {}
    for sid, values in seen.items():
        out.counts["strings", "conflicting_string_id"] += len(values) - 1
        present = sorted(v for v in values if v is not None)
        names[sid] = present[0] if present else None
    return names  # type: ignore[return-value]


def _impossible(out: Repair, frame: str, rows: list[tuple[str, dict]], lo: int,
                hi: int) -> list[tuple[str, dict]]:
    kept, outside, missing = [], 0, 0
    flagged = []
    for table, r in rows:
        s, e = r["start"], r["end"]
        ranged = table != NVTX or NVTX_EVENT_TYPES[r["eventType"]] != "mark"
        has_end = ranged and e is not None if table == NVTX else True
        if frame == "gpu_ops" and s == 0 and e == 0:
            rule = "unrecorded"
        elif s is None or (table != NVTX and e is None):
            rule = "missing_timestamp"
            missing += 1
        elif not lo <= s <= hi or (has_end and not lo <= e <= hi):
            rule = "outside_session"
            outside += 1
        elif has_end and e < s:
            rule = "negative_duration"
        else:
            kept.append((table, r))
            continue
        flagged.append((table, r, rule))
    # most rows outside the session: nsysan takes the window from the data (not modelled)
    assume(outside * 2 <= len(rows) - missing - sum(f[2] == "unrecorded" for f in flagged))
    for table, r, rule in flagged:
        out.counts[frame, rule] += 1
        out.drop.setdefault(table, set()).add(r["_rowid"])
    return kept


def _copies(out: Repair, frame: str, rows: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    seen, kept = set(), []
    for table, r in rows:
        key = (table, *(v for k, v in sorted(r.items()) if k != "_rowid"))
        if key in seen:
            out.counts[frame, "duplicate_row"] += 1
            out.drop.setdefault(table, set()).add(r["_rowid"])
        else:
            seen.add(key)
            kept.append((table, r))
    return kept


def _twins(out: Repair, rows: list[tuple[str, dict]], names: dict[int, str]) -> None:
    groups: dict[tuple[int, int], list[dict]] = {}
    for _, r in rows:
        if r["globalTid"] is not None and r["correlationId"] is not None:
            groups.setdefault((r["globalTid"] & -(1 << 24), r["correlationId"]), []).append(r)
    for members in groups.values():
        if len(members) < 2:
            continue

        def key(r: dict) -> tuple:
            name = names.get(r["nameId"])
            name = None if name is None else re.sub(r"_v\d{4,}$", "", name)
            return (-r["start"], r["end"], name is None, name or "", r["start"], r["_rowid"])

        for r in sorted(members, key=key)[1:]:
            out.counts["cuda_api", "duplicate_correlation"] += 1
            out.drop.setdefault(RUNTIME, set()).add(r["_rowid"])


def write_repaired(broken: Path, fix: Repair, dst: Path) -> Path:
    """``broken`` with the oracle's repairs: dropped rows deleted (NVTX rows made non-events,
    keeping every row position), non-integer values NULL, StringIds one value per id."""
    copy_export(broken, dst)
    for table in {*fix.drop, *fix.nulled}:
        relax(dst, table)
        for rowid, columns in fix.nulled.get(table, {}).items():
            sets = ", ".join(f'"{c}" = NULL' for c in sorted(columns))
            execute(dst, f'UPDATE "{table}" SET {sets} WHERE rowid = {rowid}')
        for rowid in fix.drop.get(table, ()):
            if table == NVTX:
                execute(dst, f"UPDATE NVTX_EVENTS SET eventType = 999 WHERE rowid = {rowid}")
            else:
                execute(dst, f'DELETE FROM "{table}" WHERE rowid = {rowid}')
    if any(f == "strings" for f, _ in fix.counts):
        relax(dst, "StringIds")
        execute(
            dst,
            "DELETE FROM StringIds WHERE typeof(id) != 'integer' OR rowid NOT IN "
            "(SELECT min(rowid) FROM StringIds WHERE typeof(id) = 'integer' AND (id, value) "
            "IN (SELECT id, min(value) FROM StringIds GROUP BY id) GROUP BY id)",
        )
    return dst


# --- the mutations ----------------------------------------------------------------------------


def _present(path: Path) -> list[str]:
    names = {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    return [t for t in TABLES if t in names and query(path, f'SELECT count(*) FROM "{t}"')[0][0]]


@st.composite
def mutation(draw: st.DrawFn, tables: list[str]) -> tuple:
    table = draw(st.sampled_from([*tables, "StringIds"]))
    k, r = draw(st.integers(2, 9)), draw(st.integers(0, 8))
    where = f"rowid % {k} = {r % k}"
    if table == "StringIds":
        kind = draw(st.sampled_from(["conflict", "copy", "bad id"]))
        return ("strings", kind, where)
    ints = [c for c in TABLES[table][1] if c not in ("eventType",)]
    kind = draw(st.sampled_from(["value", "value", "negative", "copy rows", "copy table",
                                 "shuffle", "delete", "drop column", "retype", "twins",
                                 "drop table"]))
    if kind == "value":
        column = draw(st.sampled_from(["start", "end", "start", *ints]))
        return (table, kind, where, column, draw(st.sampled_from(STRANGE_VALUES)))
    if kind == "drop column":
        return (table, kind, draw(st.sampled_from([*sorted(set(ints) - {"start"}), "start"])))
    if kind == "retype":
        return (table, kind, draw(st.sampled_from(["start", "end", *ints])),
                draw(st.sampled_from(["TEXT", "REAL"])))
    if kind == "shuffle":
        return (table, kind, draw(st.integers(3, 97)))
    return (table, kind, where)


#: mutations the oracle does not model (the CLI property only): tables every analysis reads
#: around the events, the session length, names
OTHER_MUTATIONS = st.one_of(
    st.tuples(st.just("other"), st.just("drop table"), st.sampled_from(
        ["StringIds", "ANALYSIS_DETAILS", "TARGET_INFO_GPU", "ThreadNames", "PROCESSES",
         "EXPORT_META_DATA", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_CUDA_STREAM"])),
    st.tuples(st.just("other"), st.just("duration"),
              st.sampled_from([None, 0, -5, 1, "x", INT64_MAX, 10**12])),
    st.tuples(st.just("other"), st.just("nvtx text"),
              st.sampled_from([None, "", "x" * 70_000, b"\xff\xfe", "<script>", 7])),
)


def apply(path: Path, m: tuple) -> None:
    table, kind = m[0], m[1]
    if table == "other":
        _apply_other(path, kind, m[2])
        return
    columns = [c for c, _ in declared(path, "StringIds" if table == "strings" else table)]
    if not columns:
        return  # dropped by an earlier mutation
    names = ", ".join(f'"{c}"' for c in columns)
    if table == "strings":
        where = m[2]
        relax(path, "StringIds")
        if kind == "conflict":
            execute(path, f"INSERT INTO StringIds SELECT id, value || '~' FROM StringIds "
                          f"WHERE {where}")
        elif kind == "copy":
            execute(path, f"INSERT INTO StringIds SELECT * FROM StringIds WHERE {where}")
        else:
            execute(path, f"INSERT INTO StringIds SELECT 'id' || id, value FROM StringIds "
                          f"WHERE {where}")
    elif kind == "value":
        _, _, where, column, value = m
        if column in columns:
            relax(path, table)
            execute(path, f'UPDATE "{table}" SET "{column}" = ? WHERE {where}', params=(value,))
    elif kind == "negative":
        execute(path, f'UPDATE "{table}" SET end = start - 1 - rowid % 1000 WHERE {m[2]}')
    elif kind == "copy rows":
        execute(path, f'INSERT INTO "{table}" ({names}) SELECT {names} FROM "{table}" '
                      f"WHERE {m[2]}")
    elif kind == "copy table":
        execute(path, f'INSERT INTO "{table}" ({names}) SELECT {names} FROM "{table}"')
    elif kind == "shuffle":
        execute(path, f'CREATE TABLE "_s" AS SELECT * FROM "{table}" ORDER BY (rowid * {m[2]}) '
                      f"% 101, rowid", f'DELETE FROM "{table}"',
                f'INSERT INTO "{table}" SELECT * FROM "_s"', 'DROP TABLE "_s"')
    elif kind == "delete":
        execute(path, f'DELETE FROM "{table}" WHERE {m[2]}')
    elif kind == "drop column":
        if m[2] in columns:
            execute(path, f'ALTER TABLE "{table}" DROP COLUMN "{m[2]}"')
    elif kind == "retype":
        if m[2] in columns:
            relax(path, table, {m[2]: m[3]})
    elif kind == "twins":
        if table == RUNTIME:
            execute(path, f"INSERT INTO {RUNTIME} ({names}) SELECT {names} FROM {RUNTIME} "
                          f"WHERE {m[2]}",
                    f"UPDATE {RUNTIME} SET start = start - 50, end = end + 50, nameId = "
                    f"(SELECT min(id) FROM StringIds) WHERE rowid > (SELECT max(rowid) - "
                    f"(SELECT count(*) FROM {RUNTIME} WHERE {m[2]}) FROM {RUNTIME})")
    elif kind == "drop table":
        execute(path, f'DROP TABLE "{table}"')


def _apply_other(path: Path, kind: str, arg: object) -> None:
    names = {r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type='table'")}
    if kind == "drop table" and arg in names:
        execute(path, f'DROP TABLE "{arg}"')
    elif kind == "duration" and "ANALYSIS_DETAILS" in names:
        relax(path, "ANALYSIS_DETAILS")
        execute(path, "UPDATE ANALYSIS_DETAILS SET duration = ?", params=(arg,))
    elif kind == "nvtx text" and NVTX in names:
        execute(path, "UPDATE NVTX_EVENTS SET text = ? WHERE rowid % 3 = 1", params=(arg,))


# --- the properties ---------------------------------------------------------------------------

ROW_RULES = {"unrecorded", "missing_timestamp", "outside_session", "negative_duration",
             "duplicate_row", "duplicate_correlation", "conflicting_string_id",
             "missing_string_id", "value_not_integer", "value_not_text"}


def _counts(path: Path) -> Counter:
    trace = open_trace(path, trace_id="t", frame_cache=False)
    trace.load_all()
    return Counter({(frame, rule): e["rows"] for frame, q in trace.meta.quality.items()
                    for rule, e in q["rules"].items() if rule in ROW_RULES})


def check(base: Path, mutations: list[tuple], work: Path) -> None:
    broken = copy_export(base, work / "broken" / "t.sqlite")
    for m in mutations:
        apply(broken, m)
    fix = repair(broken)
    if fix.error:
        with pytest.raises(NsysanError):
            _counts(broken)
        return
    repaired = write_repaired(broken, fix, work / "repaired" / "t.sqlite")
    assert _counts(broken) == +fix.counts, mutations
    assert _counts(repaired) == Counter(), mutations  # the oracle's copy is clean
    assert_same_frames(broken, repaired)


def _bases() -> list[Path]:
    return [EXAMPLE, LAYERS, REAL_EXPORT]


@pytest.mark.slow
@pytest.mark.parametrize("base", _bases(), ids=["example_ddp", "example_layers", "dlprof"])
def test_mutated_exports_read_as_their_repaired_copies(base: Path) -> None:
    if not base.is_file():
        unavailable(f"{base} not found")
    tables = _present(base)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(st.lists(mutation(tables), min_size=1, max_size=3))
    def run(mutations: list[tuple]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            check(base, mutations, Path(tmp))

    run()


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.slow
def test_mutated_exports_through_the_cli() -> None:
    """Exit 0 with complete outputs, or exit 1 with one line and no output folder; never a
    traceback or a change outside the output folder."""
    tables = _present(EXAMPLE)

    @settings(max_examples=max(EXAMPLES // 2, 5), deadline=None, derandomize=True,
              database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.one_of(mutation(tables), OTHER_MUTATIONS), min_size=1, max_size=3))
    def run(mutations: list[tuple]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            broken = copy_export(EXAMPLE, work / "in" / "t.sqlite")
            for m in mutations:
                apply(broken, m)
            before = _listing(work / "in")
            result = CliRunner().invoke(cli, ["analyze", str(broken), "-o", str(work / "out")])
            assert result.exception is None or isinstance(result.exception, SystemExit), \
                (mutations, result.exception)
            assert "Traceback" not in result.output
            assert _listing(work / "in") == before  # the input folder is untouched
            out = work / "out" / "t"
            if result.exit_code == 0:
                import json

                manifest = json.loads((out / "manifest.json").read_text())
                for entry in manifest["outputs"]:
                    assert (out / entry["path"]).is_file(), entry
                assert not [p for p in (work / "out").iterdir() if p.name != "t"]
            else:
                assert result.exit_code == 1, (mutations, result.output)
                lines = result.stderr.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
                assert not out.exists()

    run()


@pytest.mark.parametrize(
    "sql",
    [
        f"UPDATE {KERNEL} SET end = {INT64_MAX} WHERE rowid = 5",
        f"UPDATE {KERNEL} SET start = -{INT64_MAX}, end = {INT64_MAX} WHERE rowid % 4 = 0",
        f"UPDATE {RUNTIME} SET start = 'x', end = 2.5 WHERE rowid % 3 = 0",
        "UPDATE NVTX_EVENTS SET start = end + 1000, end = start WHERE rowid % 2 = 0",
    ],
)
def test_hostile_values_in_a_real_process_give_no_traceback(tmp_path: Path, sql: str) -> None:
    path = copy_export(EXAMPLE, tmp_path / "t.sqlite")
    execute(path, sql)
    done = subprocess.run([sys.executable, "-m", "nsysan", "analyze", str(path), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and not done.stderr.strip(), done.stderr
