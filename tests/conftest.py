"""Shared test fixtures: the real traces in ../shared/traces and the nsys CLI.

Both are optional locally (tests that need them skip) but required under CI (``CI=true``), where
their absence fails the test instead: a CI run that silently skipped every real-trace test would
prove nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
#: ../shared/traces, or $NSYSAN_SHARED_TRACES (a checkout that is not beside shared/, e.g. a
#: git worktree)
SHARED_TRACES = Path(os.environ.get("NSYSAN_SHARED_TRACES") or REPO_ROOT.parent / "shared"
                     / "traces")
#: parameter used in place of shared-trace paths when none are found, so that a parametrized
#: test still runs once and its `shared_traces` fixture skips (or fails under CI)
NO_SHARED = "<no shared traces>"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip locally; fail under CI, where every prerequisite must be present."""
    if in_ci():
        pytest.fail(f"{reason} (required when CI=true)")
    pytest.skip(reason)


def shared_files(*patterns: str, root: Path = SHARED_TRACES) -> list[str]:
    """Paths relative to ``root`` of the shared traces matching ``patterns`` (globs such as
    ``*/*.sqlite``), sorted; ``[NO_SHARED]`` when there are none (see `NO_SHARED`)."""
    found = sorted({p.relative_to(root).as_posix() for pat in patterns for p in root.glob(pat)})
    return found or [NO_SHARED]


def shared_sqlite_files(root: Path = SHARED_TRACES) -> list[str]:
    """Every SQLite export under the shared traces, relative to ``root``."""
    return shared_files("*/*.sqlite", root=root)


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """Path of ../shared/traces (skips locally, fails under CI=true when it is absent)."""
    if not SHARED_TRACES.is_dir() or not any(SHARED_TRACES.iterdir()):
        unavailable(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def nsys_bin() -> Path:
    """Path of the nsys CLI ($NSYSAN_NSYS, else PATH; skips locally, fails under CI=true)."""
    named = os.environ.get("NSYSAN_NSYS")
    if named and Path(named).is_file() and os.access(named, os.X_OK):
        return Path(named)
    found = shutil.which("nsys")
    if not found:
        unavailable("nsys (Nsight Systems CLI) not found on PATH")
    return Path(found)  # type: ignore[arg-type]


@pytest.fixture(scope="session", autouse=True)
def _isolated_export_cache(tmp_path_factory: pytest.TempPathFactory):
    """Exports made by any test land in a temporary cache, never in ~/.cache/nsysan (tests
    that need a specific cache directory override NSYSAN_CACHE_DIR themselves)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NSYSAN_CACHE_DIR", str(tmp_path_factory.mktemp("nsysan-cache")))
        yield


# --- tiny nsys-shaped SQLite files ------------------------------------------------------------

#: column declarations of the nsys tables the loader reads, as nsys 2022.4 writes them (subset)
NSYS_DDL: dict[str, str] = {
    "StringIds": "id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL",
    "ANALYSIS_DETAILS": "globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, "
    "startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL",
    "EXPORT_META_DATA": "name TEXT NOT NULL, value TEXT",
    "META_DATA_CAPTURE": "name TEXT NOT NULL, value TEXT",
    "TARGET_INFO_SESSION_START_TIME": "utcEpochNs INTEGER, utcTime TEXT, localTime TEXT",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, "
    "correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, "
    "shortName INTEGER NOT NULL, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, "
    "blockY INTEGER, blockZ INTEGER, graphNodeId INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, "
    "correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, "
    "copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER, graphNodeId INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, "
    "correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, "
    "graphNodeId INTEGER, memKind INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, "
    "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "start INTEGER NOT NULL, end INTEGER NOT NULL, "
    "deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, "
    "correlationId INTEGER, globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, "
    "rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, "
    "endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER, "
    "int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, "
    "floatValue REAL, jsonTextId INTEGER, jsonText TEXT",
    "OSRT_API": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
    "globalTid INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, "
    "nestingLevel INTEGER, callchainId INTEGER",
    "PROFILER_OVERHEAD": "start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, "
    "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL",
    "TARGET_INFO_GPU": "vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT, "
    "busLocation TEXT, totalMemory INTEGER, memoryBandwidth INTEGER, clockRate INTEGER, "
    "smCount INTEGER, uuid TEXT, cuDevice INTEGER, computeMajor INTEGER, computeMinor INTEGER",
    "TARGET_INFO_CUDA_STREAM": "streamId INTEGER NOT NULL, hwId INTEGER NOT NULL, "
    "vmId INTEGER NOT NULL, processId INTEGER NOT NULL, contextId INTEGER NOT NULL, "
    "priority INTEGER NOT NULL, flag INTEGER NOT NULL",
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
    "ENUM_CUDA_MEM_KIND": "id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT",
}


def gtid(pid: int, tid: int, hw_vm: int = 0x0001) -> int:
    """An nsys globalTid: <HW:8><VM:8><PID:24><TID:24> (signed 64-bit like SQLite stores it)."""
    value = (hw_vm << 48) | (pid << 24) | tid
    return value - (1 << 64) if value >= 1 << 63 else value


def make_nsys_sqlite(
    path: Path,
    tables: dict[str, list[dict]],
    *,
    strings: dict[int, str] | None = None,
    duration: int | None = 1_000_000,
    ddl: dict[str, str] | None = None,
) -> Path:
    """Write a minimal nsys-shaped export: StringIds (``strings``), ANALYSIS_DETAILS (when
    ``duration`` is not None) and ``tables`` (rows as column -> value dicts; columns a row
    omits are NULL). Table declarations come from `NSYS_DDL`, overridable with ``ddl``."""
    import sqlite3

    decl = {**NSYS_DDL, **(ddl or {})}
    con = sqlite3.connect(path)
    try:
        all_tables = {"StringIds": [{"id": k, "value": v} for k, v in (strings or {}).items()]}
        if duration is not None:
            all_tables["ANALYSIS_DETAILS"] = [
                {"globalVid": 1 << 48, "duration": duration, "startTime": 0, "stopTime": duration}
            ]
        all_tables.update(tables)
        for table, rows in all_tables.items():
            con.execute(f'CREATE TABLE "{table}" ({decl[table]})')
            cols = [c.split()[0] for c in decl[table].split(", ")]
            for row in rows:
                unknown = set(row) - set(cols)
                assert not unknown, f"{table} has no column {unknown}"
            con.executemany(
                f'INSERT INTO "{table}" ({", ".join(cols)}) VALUES ({", ".join("?" * len(cols))})',
                [tuple(row.get(c) for c in cols) for row in rows],
            )
        con.commit()
    finally:
        con.close()
    return path


# --- a stand-in for nsys ----------------------------------------------------------------------

OLD_HEADER = b"NVIDIA Tegra Profiler Report 1.\n\x0bLocal (CLI)"
NEW_HEADER = b"NVIDIA Tegra Profiler Report 2025@1@1@110-251135451612v0.\n\x0bLocal (CLI)"
TOO_NEW = (
    "report recorded with Nsight Systems 2025.1.1; installed nsys is 2022.4.2 — install 2025.1 "
    "or newer, or export on the recording machine and pass the .sqlite"
)

PROTOBUF = (
    r"nsys 2022.4.2 cannot read this report \(protobuf parse error\); it was probably "
    r"recorded with a newer Nsight Systems"
)

FAKE_NSYS = r"""#!/bin/sh
# A stand-in for nsys: behaviour from FAKE_MODE, one line per export call in FAKE_LOG.
if [ "$1" = "--version" ]; then
  echo "NVIDIA Nsight Systems version ${FAKE_VERSION:-2022.4.2.1-df9881f}"; exit 0
fi
out=""
while [ $# -gt 0 ]; do
  case "$1" in --output|-o) out="$2"; shift;; esac
  shift
done
[ -n "$FAKE_LOG" ] && echo "export $out" >> "$FAKE_LOG"
case "$FAKE_MODE" in
  ok) cp "$FAKE_SRC" "$out"; exit 0;;
  partial) printf 'SQLite format 3\000partial' > "$out"
           echo "Exportation error: boom" >&2; exit 1;;
  invalid) echo "Exportation error: Version number is invalid: 2025@5@1@121-255136380782v0" >&2
           exit 1;;
  protobuf) printf 'SQLite format 3\000partial' > "$out"
            echo "Can't parse message of type \"QuadDAnalysis.Data.SessionState\"" >&2
            echo "Dynamic exception type: QuadDCommon::ProtobufParseException" >&2
            exit 1;;
  silent) exit 0;;
esac
exit 3
"""
