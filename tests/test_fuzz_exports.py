"""Fuzz suite: hypothesis mutations of real exports (issue 16).

Each example copies an export (two project fixtures and, when present, a small real export of
schema 2.9.1) and breaks it with SQL: rows deleted, copied, shuffled or given NULL, text, real,
blob, huge and negative values, tables dropped or written twice, columns dropped or declared
with another type, StringIds ids doubled, launch calls given nested twins. For every mutation
either nsysan reads the export, its frames equal those of the same export repaired by an
independent oracle (`fuzz_oracle.repair`: the rules of docs/data-quality.md written out row by
row in plain Python) and every repaired row is counted, or it refuses with one `NsysanError`;
through the CLI, exit 0 with complete outputs or exit 1 with one ``Error:`` line, never a
traceback, a partial output or a change outside the output folder.

Reproducible in CI: ``derandomize=True``, and a bounded number of examples
(``NSYSAN_FUZZ_EXAMPLES`` raises it for a long local run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SHARED_TRACES, unavailable
from export_mutations import (
    EXAMPLE,
    KERNEL,
    LAYERS,
    RUNTIME,
    assert_same_frames,
    copy_export,
    declared,
    execute,
    query,
    relax,
)
from fuzz_oracle import TABLES, repair, write_repaired
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsysan.cli import cli
from nsysan.errors import NsysanError
from nsysan.load import open_trace

NVTX = "NVTX_EVENTS"
REAL_EXPORT = SHARED_TRACES / "dlprof-pyprof-nvtx" / "nsys_profile.sqlite"
EXAMPLES = int(os.environ.get("NSYSAN_FUZZ_EXAMPLES", "25"))
INT64_MAX = (1 << 63) - 1

STRANGE_VALUES = [None, "abc", 1.5, b"\x00\x01", 10**15, INT64_MAX, -(1 << 63),
                  -5_000_000_000, -1, 0]


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
