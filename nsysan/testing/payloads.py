"""NCCL NVTX payloads written into synthetic exports, in the two layouts real exports use.

- ``"json"`` (mid-2024 exports, schema ~3.11-3.16): ``NVTX_EVENTS.jsonText`` holds a JSON
  object keyed by the payload entry names. The column exists from the 2022.4 layout on.
- ``"binary"`` (2025+ exports, schema 3.2x): ``NVTX_EVENTS.binaryData`` holds a blob (a 32-byte
  header of u64 domainId, schemaId, payload size, payload offset = 32, then the payload) and
  ``NVTX_PAYLOAD_SCHEMAS`` / ``NVTX_PAYLOAD_SCHEMA_ENTRIES`` describe it. The schema ids,
  entry names, types and offsets below are those of the 2-GPU H100 export in
  ``../shared/traces/nsysai-h100-2gpu`` (NCCL's ``nvtx_payload_schemas.h``); the file itself has
  the schemas but no blobs. Writing a binary payload also adds the ``binaryData`` column and
  marks the export as schema 3.25.0 (nsys 2026.2.1), as that file is.

`add_payloads` edits a file `nsysan.testing.synth.TraceBuilder` wrote: it finds each event by
``(start, globalTid, text)`` (the builder writes NVTX names inline).
"""

from __future__ import annotations

import json
import sqlite3
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nsysan.errors import ConfigError

#: NVTX payload entry types (nvToolsExtPayload.h) -> struct format
_FORMATS = {5: "<i", 16: "<I", 17: "<q", 18: "<Q", 22: "<Q"}
REDUCTION_ENUM = 16777232  # an enum schema id: no width without NVTX_PAYLOAD_ENUMS


@dataclass(frozen=True)
class PayloadSchema:
    schema_id: int
    payload_size: int
    entries: tuple[tuple[str, int, int], ...]  # (name, entry type, offset)


#: NCCL's schemas, keyed by what they describe (ids and layout as exported by nsys 2026.2)
NCCL_SCHEMAS: dict[str, PayloadSchema] = {
    "comm_init": PayloadSchema(16777218, 24, (
        ("NCCL communicator ID", 18, 0), ("No. of ranks", 5, 8), ("Rank", 5, 12),
        ("CUDA device", 5, 16))),
    "all_reduce": PayloadSchema(16777223, 24, (
        ("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8),
        ("Reduction operation", REDUCTION_ENUM, 16))),
    "all_gather": PayloadSchema(16777220, 16, (
        ("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8))),
    "send": PayloadSchema(16777226, 24, (
        ("NCCL communicator ID", 18, 0), ("Message size [bytes]", 22, 8),
        ("Peer rank", 5, 16))),
}
BLOB_HEADER = struct.Struct("<QQQQ")


@dataclass(frozen=True)
class Payload:
    """The payload of one NVTX event (found by start, globalTid and name)."""

    start_ns: int
    global_tid: int
    name: str
    schema: str  # key of NCCL_SCHEMAS
    values: Mapping[str, int]
    truncate_to: int | None = None  # binary: cut the blob to this many bytes (partial)


def encode_blob(domain_id: int, schema: PayloadSchema, values: Mapping[str, int],
                truncate_to: int | None = None) -> bytes:
    """A ``binaryData`` blob: header + payload with ``values`` at their entries' offsets
    (entries not in ``values`` stay zero bytes)."""
    body = bytearray(schema.payload_size)
    for name, etype, offset in schema.entries:
        if name in values:
            fmt = _FORMATS.get(etype, "<i")  # enums: a C enum, 4 bytes
            struct.pack_into(fmt, body, offset, values[name])
    blob = BLOB_HEADER.pack(domain_id, schema.schema_id, schema.payload_size,
                            BLOB_HEADER.size) + bytes(body)
    return blob[:truncate_to] if truncate_to is not None else blob


def _domain_ids(con: sqlite3.Connection) -> dict[int, int]:
    """pid -> the NCCL domain id in that process."""
    rows = con.execute("SELECT globalTid, domainId FROM NVTX_EVENTS WHERE eventType = 75 AND "
                       "text = 'NCCL'").fetchall()
    return {(gtid >> 24) & 0xFFFFFF: dom for gtid, dom in rows}


def add_payloads(path: str | Path, payloads: Iterable[Payload], layout: str) -> Path:
    """Write ``payloads`` into the export at ``path`` in ``layout`` (``json`` | ``binary``)."""
    if layout not in ("json", "binary"):
        raise ConfigError(f"payload layout {layout!r}: use json or binary")
    path = Path(path)
    con = sqlite3.connect(path)
    try:
        domains = _domain_ids(con)
        cols = [r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")]
        if layout == "binary":
            if "binaryData" not in cols:
                con.execute("ALTER TABLE NVTX_EVENTS ADD COLUMN binaryData TEXT")
            _write_schemas(con, sorted(set(domains.values())))
            _mark_schema(con)
        for p in payloads:
            where = "start = ? AND globalTid = ? AND text = ?"
            key = (p.start_ns, p.global_tid, p.name)
            if layout == "json":
                text = json.dumps(dict(p.values), separators=(",", ":"))
                cur = con.execute(f"UPDATE NVTX_EVENTS SET jsonText = ? WHERE {where}",
                                  (text, *key))
            else:
                pid = (p.global_tid >> 24) & 0xFFFFFF
                if pid not in domains:
                    raise ConfigError(f"process {pid} has no NCCL domain for a payload")
                blob = encode_blob(domains[pid], NCCL_SCHEMAS[p.schema], p.values,
                                   p.truncate_to)
                cur = con.execute(f"UPDATE NVTX_EVENTS SET binaryData = ? WHERE {where}",
                                  (blob, *key))
            if cur.rowcount != 1:
                raise ConfigError(f"payload for {p.name!r} at {p.start_ns}: {cur.rowcount} "
                                  "events match (need exactly one)")
        con.commit()
    finally:
        con.close()
    return path


def _write_schemas(con: sqlite3.Connection, domain_ids: list[int]) -> None:
    con.execute("CREATE TABLE IF NOT EXISTS NVTX_PAYLOAD_SCHEMAS (domainId INTEGER, schemaId "
                "INTEGER, name TEXT, type INTEGER, flags INTEGER, numEntries INTEGER, "
                "payloadSize INTEGER, alignTo INTEGER)")
    con.execute("CREATE TABLE IF NOT EXISTS NVTX_PAYLOAD_SCHEMA_ENTRIES (domainId INTEGER NOT "
                "NULL, schemaId INTEGER NOT NULL, idx INTEGER NOT NULL, flags INTEGER, type "
                "INTEGER, name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset "
                "INTEGER)")
    if con.execute("SELECT count(*) FROM NVTX_PAYLOAD_SCHEMAS").fetchone()[0]:
        return
    for dom in domain_ids:
        for schema in NCCL_SCHEMAS.values():
            con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMAS VALUES (?, ?, NULL, 1, NULL, ?, ?, "
                        "NULL)", (dom, schema.schema_id, len(schema.entries),
                                  schema.payload_size))
            for i, (name, etype, offset) in enumerate(schema.entries):
                # the first entry's offset is NULL in real exports
                con.execute("INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES (?, ?, ?, NULL, ?, "
                            "?, NULL, NULL, ?)",
                            (dom, schema.schema_id, i, etype, name, offset if i else None))


def _mark_schema(con: sqlite3.Connection) -> None:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "META_DATA_EXPORT" not in tables:
        return
    for name, value in (("EXPORT_SCHEMA_VERSION", "3.25.0"), ("EXPORT_SCHEMA_VERSION_MAJOR", "3"),
                        ("EXPORT_SCHEMA_VERSION_MINOR", "25"),
                        ("EXPORT_SCHEMA_VERSION_MICRO", "0"),
                        ("EXPORT_PRODUCT_VERSION", "2026.2.1"), ("EXPORT_PRODUCT_DATE", "2026.2")):
        con.execute("UPDATE META_DATA_EXPORT SET value = ? WHERE name = ?", (value, name))
