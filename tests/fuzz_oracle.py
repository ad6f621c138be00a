"""The independent oracle of the fuzz suite (tests/test_fuzz_exports.py): the data-quality
rules of docs/data-quality.md written out row by row in plain Python, without nsysan.

`repair` reads a (mutated) export with the stdlib and says which rows the rules must drop and
which values they must read as NULL, and how many of each; `write_repaired` writes the copy that
a careful person would have made by hand. nsysan's frames of the mutated export must equal those
of that copy. What it does not model (the data window of exports without a usable session, the
majority guard) it rejects with `hypothesis.assume`.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from export_mutations import (
    KERNEL,
    MEMCPY,
    MEMSET,
    RUNTIME,
    SYNC,
    copy_export,
    declared,
    execute,
    query,
    relax,
)
from hypothesis import assume

OSRT, OVERHEAD, NVTX = "OSRT_API", "PROFILER_OVERHEAD", "NVTX_EVENTS"

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
