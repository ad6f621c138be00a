"""NVTX binary (schema-based) payloads -> the JSON text of the nvtx frame's ``payload_json``.

Two export layouts carry NVTX extended payloads such as NCCL's (`Message size [bytes]`,
`NCCL communicator ID`, `No. of ranks`, ...; ../research/nsys-sqlite-schema.md §6.3, §8.3):

- **mid-2024** (schema ~3.11-3.16): a JSON object in ``NVTX_EVENTS.jsonText`` (or via
  ``jsonTextId``) whose keys are the schema entries' names. `adapters_nvtx` reads it as is.
- **2025+** (schema 3.2x): a blob in ``NVTX_EVENTS.binaryData`` (declared TEXT) plus the
  ``NVTX_PAYLOAD_SCHEMAS`` / ``NVTX_PAYLOAD_SCHEMA_ENTRIES`` tables. This module decodes it.

Blob layout (two independent third-party decoders agree; not in NVIDIA's docs): a 32-byte
little-endian header of four u64 — domainId, schemaId, payload size, payload offset (normally
32) — then the payload; each entry's value sits at its ``offset`` (NULL = 0, allowed for the
first entry only) inside the payload, with the width of its entry ``type``.

Decoded payloads are rendered as the JSON object the mid-2024 layout has (``{"NCCL
communicator ID":…,"Message size [bytes]":…}``, keys in entry order), so everything that reads
``payload_json`` works on both layouts. Rules (never invent a value):

- an event with no blob, or a blob whose ``(domainId, schemaId)`` has no schema, or whose schema
  is ambiguous (the schema tables have no process column; two different entry lists under one
  key cannot be told apart) has no payload (null);
- a field whose bytes lie outside the blob or outside the schema's declared payload size, whose
  type has no fixed documented width (strings, nested schemas, enums without
  ``NVTX_PAYLOAD_ENUMS.size``), or whose offset is unknown is left out of the object: a
  partial payload keeps the fields it has. An object with no field left is null.
- a JSON text payload, when the event has one, wins (the order of §8.3: jsonText, then
  binaryData, then nothing).

Counted in the load notes: blobs seen, decoded, and why others were not.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.load.adapters import Adapter

BLOB_COLUMN = "binaryData"
SCHEMAS_TABLE = "NVTX_PAYLOAD_SCHEMAS"
ENTRIES_TABLE = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
ENUMS_TABLE = "NVTX_PAYLOAD_ENUMS"
HEADER_BYTES = 32
#: blobs longer than this are not read (NCCL's are 8-24 bytes of payload)
MAX_BLOB_BYTES = 4096

#: NVTX payload entry type -> numpy dtype (little-endian), from nvToolsExtPayload.h; only the
#: fixed-width scalar types. 5/6 are C int / unsigned int (4 bytes on the LP64 Linux hosts
#: nsys traces), 22 size_t and 23 addresses are 8 bytes.
ENTRY_DTYPES: dict[int, str] = {
    5: "<i4", 6: "<u4", 11: "<i1", 12: "<u1", 13: "<i2", 14: "<u2", 15: "<i4", 16: "<u4",
    17: "<i8", 18: "<u8", 19: "<f4", 20: "<f8", 22: "<u8", 23: "<u8",
}
_INT_BY_SIZE = {1: "<i1", 2: "<i2", 4: "<i4", 8: "<i8"}


def read_blobs(adapter: Adapter, n_rows: int) -> pl.Series | None:
    """``binaryData`` of NVTX_EVENTS as Binary, in the order of the table's other reads, or
    None when the export has no such column or no blob at all."""
    if BLOB_COLUMN not in adapter.source.columns("NVTX_EVENTS"):
        return None
    source = adapter.source
    blobs: pl.Series | None = None
    if hasattr(source, "read_blobs"):  # SQLite: a blob in a TEXT column needs its own read
        blobs = source.read_blobs("NVTX_EVENTS", BLOB_COLUMN, MAX_BLOB_BYTES)
    elif hasattr(source, "scan"):  # parquetdir: a binary column
        col = source.scan("NVTX_EVENTS", [BLOB_COLUMN]).collect().to_series()
        if col.dtype == pl.Binary:
            blobs = col.set(col.bin.size() > MAX_BLOB_BYTES, None)  # type: ignore[arg-type]
        elif col.dtype == pl.String:
            blobs = col.cast(pl.Binary)
    if blobs is None or blobs.len() != n_rows or blobs.null_count() == blobs.len():
        return None
    return blobs


def _schemas(adapter: Adapter) -> tuple[pl.DataFrame, int]:
    """``domainId, schemaId, payloadSize, entries`` (list of ``idx, type, name, offset,
    width``) per unambiguous schema, and how many keys were ambiguous."""
    entries = adapter.read(ENTRIES_TABLE, ["domainId", "schemaId", "idx"],
                           {"type": pl.Int64(), "name": pl.String(), "offset": pl.Int64()})
    sizes = (adapter.read(SCHEMAS_TABLE, ["domainId", "schemaId"], {"payloadSize": pl.Int64()})
             if adapter.has(SCHEMAS_TABLE) else
             pl.DataFrame(schema={"domainId": pl.Int64, "schemaId": pl.Int64,
                                  "payloadSize": pl.Int64}))
    enum_size = (
        adapter.read(ENUMS_TABLE, ["domainId", "schemaId"], {"size": pl.Int64()})
        .unique().group_by("domainId", "schemaId").agg(pl.col("size").unique())
        .filter(pl.col("size").list.len() == 1)
        .select("domainId", pl.col("schemaId").alias("type"),
                pl.col("size").list.first().alias("_enum_size"))
        if adapter.has(ENUMS_TABLE) else
        pl.DataFrame(schema={"domainId": pl.Int64, "type": pl.Int64, "_enum_size": pl.Int64})
    )
    widths = pl.DataFrame({"type": list(ENTRY_DTYPES),
                           "dtype": list(ENTRY_DTYPES.values())})
    rows = (
        entries.unique()
        .join(widths, on="type", how="left")
        .join(enum_size, on=["domainId", "type"], how="left")
        .with_columns(
            pl.coalesce("dtype", pl.col("_enum_size").replace_strict(
                _INT_BY_SIZE, default=None, return_dtype=pl.String)).alias("dtype"),
            # NULL offset: 0 for the first entry, unknown for any other
            pl.when(pl.col("offset").is_null() & (pl.col("idx") == 0)).then(0)
            .otherwise(pl.col("offset")).alias("offset"),
        )
        .sort("domainId", "schemaId", "idx", "name", "type", "offset", nulls_last=True)
    )
    per = rows.group_by("domainId", "schemaId", maintain_order=True).agg(
        pl.struct("idx", "name", "dtype", "offset").alias("entries"),
        pl.col("idx").n_unique().alias("_n_idx"), pl.len().alias("_n"),
    )
    size = sizes.unique().group_by("domainId", "schemaId").agg(
        pl.col("payloadSize").unique().alias("_sizes"))
    per = per.join(size, on=["domainId", "schemaId"], how="left")
    ambiguous = (per["_n_idx"] != per["_n"]) | (per["_sizes"].list.len().fill_null(0) > 1)
    good = per.filter(~ambiguous).with_columns(
        pl.col("_sizes").list.first().alias("payloadSize")).select(
        "domainId", "schemaId", "payloadSize", "entries")
    return good, int(ambiguous.sum())


def _header(buf: np.ndarray) -> np.ndarray:
    return buf[:, :HEADER_BYTES].copy().view("<u8")  # (n, 4): domain, schema, size, offset


def decode_payloads(adapter: Adapter, blobs: pl.Series) -> pl.Series:
    """The JSON payload text of every row of ``blobs`` (null where nothing decodes)."""
    n = blobs.len()
    out = pl.Series("payload_json", [None] * n, dtype=pl.String)
    present = blobs.is_not_null() & (blobs.bin.size() >= HEADER_BYTES).fill_null(False)
    n_blobs = int(blobs.is_not_null().sum())
    if not adapter.has(ENTRIES_TABLE):
        adapter.note(f"{n_blobs} NVTX binary payloads not decoded: the export has no "
                     f"{ENTRIES_TABLE} table")
        return out
    schemas, n_ambiguous = _schemas(adapter)
    rows = np.flatnonzero(present.to_numpy())
    decoded, reasons = 0, {"bad header": int(n_blobs - rows.size)}  # shorter than a header
    lengths = blobs.bin.size().fill_null(0).cast(pl.Int64).to_numpy()
    by_len = (pl.DataFrame({"row": rows.astype(np.int64), "len": lengths[rows]})
              .group_by("len").agg("row").sort("len"))
    keys = {(int(d), int(s)): (p, e) for d, s, p, e in schemas.iter_rows()}
    parts: list[pl.DataFrame] = []
    for length, idx in by_len.iter_rows():  # per distinct blob length, not per event
        at = np.asarray(idx, dtype=np.int64)
        buf = np.frombuffer(b"".join(blobs.gather(at).to_list()), dtype=np.uint8).reshape(
            at.size, length)
        head = _header(buf)
        for dom, sch, off in np.unique(head[:, [0, 1, 3]], axis=0):
            sel = np.flatnonzero((head[:, 0] == dom) & (head[:, 1] == sch) & (head[:, 3] == off))
            found = keys.get((int(dom), int(sch)))
            if found is None or off < HEADER_BYTES:
                reasons["no schema" if found is None else "bad header"] = \
                    reasons.get("no schema" if found is None else "bad header", 0) + sel.size
                continue
            text = _render(buf[sel], head[sel, 2], int(off), length, *found)
            parts.append(pl.DataFrame({"row": at[sel], "text": text}))
    if parts:
        got = pl.concat(parts).filter(pl.col("text").is_not_null()).sort("row")
        reasons["no field inside the blob"] = sum(p.height for p in parts) - got.height
        decoded = got.height
        out = out.scatter(got["row"], got["text"])
    left = {k: v for k, v in reasons.items() if v}
    why = "; ".join(f"{v} {k}" for k, v in sorted(left.items()))
    amb = f"; {n_ambiguous} payload schemas ambiguous (ignored)" if n_ambiguous else ""
    adapter.note(f"NVTX binary payloads: {decoded} of {n_blobs} decoded"
                 + (f" ({why})" if why else "") + amb)
    return out


def _render(buf: np.ndarray, size: np.ndarray, off: int, length: int,
            declared: int | None, entries: list[dict]) -> pl.Series:
    """JSON text per row of ``buf`` (blobs of one length, schema and payload offset)."""
    pieces = []
    for e in entries:
        if e["dtype"] is None or e["offset"] is None or e["offset"] < 0 or not e["name"]:
            continue
        width = np.dtype(e["dtype"]).itemsize
        end = e["offset"] + width  # inside the payload
        if (declared is not None and end > declared) or off + end > length:
            continue
        vals = buf[:, off + e["offset"]:off + end].copy().view(e["dtype"]).ravel()
        series = pl.Series(vals)
        if series.dtype.is_float():
            series = series.cast(pl.Float64)
            series = series.set(~series.is_finite(), None)  # type: ignore[arg-type]
        ok = pl.Series(end <= size)
        prefix = _json_key(str(e["name"])) + ":"
        pieces.append(pl.when(ok).then(pl.lit(prefix) + series.cast(pl.String)))
    if not pieces:
        return pl.Series([None] * buf.shape[0], dtype=pl.String)
    body = pl.select(pl.concat_str(pieces, separator=",", ignore_nulls=True)).to_series()
    return pl.select(pl.when(body != "").then(pl.lit("{") + body + pl.lit("}"))).to_series()


def _json_key(name: str) -> str:
    import json

    return json.dumps(name)
