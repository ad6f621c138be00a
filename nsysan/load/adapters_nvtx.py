"""NVTX_EVENTS -> the canonical ``nvtx`` frame: ranges and marks, named, with their nesting.

Rules (nsys facts from ../research/nsys-sqlite-schema.md §6, choices marked as such):

- rows: eventType 59 push/pop and 70 NVTXT push/pop -> ``push_pop``; 60 start/end and 71 NVTXT
  start/end -> ``start_end``; 34 mark -> ``mark`` with ``end_ns = start_ns``. Everything else
  (domain and category definitions, thread names) is not an event.
- ``name`` = ``text``, else StringIds via ``textId`` (Python's nvtx package registers every
  message, so its ranges carry only ``textId``; both forms mix within one file).
- ``domain``: the text of the eventType 75 (domain create) row with the same ``domainId`` **and
  the same process** (domain ids are per process); ``""`` for domain 0; null when the create
  row was not captured (e.g. an export trimmed by its author). A domain created more than once
  in a process takes the name of its earliest create event (the smallest name on a tie).
- ``range_id`` (choice): the event's position, counted from 1, in the **content order** of the
  events: (``start_ns``, ``end_ns`` descending, ``global_tid``, ``end_global_tid``, ``style``,
  ``domain``, ``name``, ``category``, ``payload_json``, ``unterminated``), nulls first. It
  depends on what the events are, never on where the export lists them (Nsight Systems 2025.6+
  does not promise the row order of its exports, so the SQLite ``rowid`` can differ between two
  exports of one capture, and ``eventId`` exists only from schema 3.28), so it is the same in
  every export of the same events, SQLite or parquetdir. Events equal in all those columns are
  indistinguishable, and whichever gets which id, the frame is the same. It is *not* the
  RangeId of nsys's own ``nvtxgpuproj`` report (the rowid); match those rows by content. A
  range starts no later than its children and is not shorter, so on each thread a parent's
  ``range_id`` is smaller than its children's.
- a NULL ``end`` (an unterminated range in some exports) becomes the session end
  (``ANALYSIS_DETAILS.duration``); ``unterminated`` is true when the end was NULL or equals the
  session end, which is where nsys 2022.4/2023.4 put ranges that were never closed.
- ``payload_json``: the event's JSON payload (``jsonText``, else via ``jsonTextId``), else its
  binary schema-based payload (``binaryData``, 2025+ exports) rendered as the same JSON object
  by `adapters_nvtx_payload`; null when it has none.
- nesting (choice): only ranges that start and end on one thread take part (``end_global_tid``
  null; marks do not take part, their depth and parent are null). On each thread, ranges are
  ordered by (start, longer first, range_id); a range's parent is the closest earlier range
  that contains it (``parent.end >= child.end``), i.e. the enclosing range with the latest start.
  For push/pop ranges this is exactly the push/pop stack; ranges of all domains nest together,
  as in nsys's own reports. Two identical intervals nest by range_id (the earlier is the parent).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from nsysan.frames import schemas
from nsysan.frames.conform import select_narrowed
from nsysan.frames.order import content_sort
from nsysan.load.adapters import Adapter, global_pid_of, pid_of, tid_of
from nsysan.load.adapters_nvtx_payload import decode_payloads, read_blobs
from nsysan.load.quality import ABSURD_NS, drop_duplicate_rows, drop_impossible

NVTX_TABLE = "NVTX_EVENTS"
STYLE_OF_EVENT_TYPE = {59: "push_pop", 70: "push_pop", 60: "start_end", 71: "start_end", 34: "mark"}
RANGE_TYPES = (59, 60, 70, 71)
MARK_TYPE = 34
DOMAIN_CREATE = 75


def build_nvtx(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(NVTX_TABLE):
        return None
    raw = adapter.read(
        NVTX_TABLE,
        ["start", "end", "eventType", "globalTid"],
        {
            "text": pl.String(),
            "textId": pl.Int64(),
            "endGlobalTid": pl.Int64(),
            "domainId": pl.Int64(),
            "category": pl.Int64(),
            "jsonText": pl.String(),
            "jsonTextId": pl.Int64(),
        },
    )
    raw = raw.with_columns(pid=pid_of("globalTid"))
    # 2025+ exports: schema-based binary payloads, decoded to the JSON text of mid-2024 ones
    blobs = read_blobs(adapter, raw.height)
    raw = raw.with_columns(
        decode_payloads(adapter, blobs).alias("blob_json") if blobs is not None
        else pl.lit(None, dtype=pl.String).alias("blob_json"))

    domains = adapter.resolve(
        raw.filter(pl.col("eventType") == DOMAIN_CREATE).select(
            "pid", "domainId", "start", "text", "textId"
        ),
        "textId",
        "domain_text",
    ).select(
        "pid",
        "domainId",
        "start",
        pl.coalesce("text", "domain_text").cast(schemas.CAT).alias("domain"),
    )
    # a domain can be created more than once in a process: the earliest create names it
    domains = (
        domains.sort("pid", "domainId", "start", "domain", nulls_last=True)
        .unique(["pid", "domainId"], keep="first", maintain_order=True)
        .drop("start")
    )

    styles = pl.DataFrame(
        {"eventType": list(STYLE_OF_EVENT_TYPE), "style": list(STYLE_OF_EVENT_TYPE.values())},
        schema={"eventType": pl.Int64, "style": schemas.NVTX_STYLE},
    )
    ev = raw.join(styles, on="eventType", how="inner", maintain_order="left")
    duration = adapter.duration_ns
    # the other rows' times, for a session end taken from the data (below); the table as
    # read is freed here, not held through the whole build (~120 bytes per event)
    others = (raw.join(styles, on="eventType", how="anti").select("start", "end")
              if duration is None else None)
    del raw, blobs
    # The data-quality rules (nsysan.load.quality) on the events: a range whose end is before
    # its start, or a timestamp outside the session, would otherwise break the nesting of
    # every later range of its thread; exact copies (a table written twice) are one range.
    quality = adapter.quality("nvtx")
    ev = drop_impossible(ev, quality, adapter.session, ranged=pl.col("style") != "mark")
    ev = drop_duplicate_rows(ev, quality, start="start",
                             columns=[c for c in ev.columns if c not in ("row", "range_id")])
    # names as Categoricals: the inline texts (read as text) are cast once, the StringIds
    # ones mapped through a lookup of the ids the events use
    ev = adapter.resolve_categorical(ev.with_columns(pl.col("text").cast(schemas.CAT)),
                                     "textId", "text_value")
    ev = adapter.resolve(ev, "jsonTextId", "json_value")
    ev = ev.join(domains, on=["pid", "domainId"], how="left", maintain_order="left")

    if duration is None:
        # no ANALYSIS_DETAILS (2020.x exports): the last NVTX timestamp is the best session end
        # (of the other rows and of the events the data-quality rules kept)
        kept = pl.concat([others, ev.select("start", "end")])
        sane = [pl.col(c).filter(pl.col(c).abs() < ABSURD_NS).max() for c in ("start", "end")]
        last = kept.select(pl.max_horizontal(sane)).item()
        duration = int(last) if last is not None else 0
    is_mark = pl.col("style") == "mark"
    ev = select_narrowed(ev, dict(
        start_ns="start",
        end_ns=pl.when(is_mark)
        .then(pl.col("start"))
        .otherwise(pl.col("end").fill_null(pl.lit(duration, dtype=pl.Int64))),
        global_tid="globalTid",
        global_pid=global_pid_of("globalTid"),
        pid="pid",
        tid=tid_of("globalTid"),
        end_global_tid="endGlobalTid",
        domain=pl.when(pl.col("domainId").fill_null(0) == 0)
        .then(pl.lit("", dtype=schemas.CAT))
        .otherwise(pl.col("domain")),
        name=pl.coalesce("text", "text_value"),
        category="category",
        style="style",
        unterminated=~is_mark & (pl.col("end").is_null() | (pl.col("end") == duration)),
        payload_json=pl.coalesce("jsonText", "json_value", "blob_json"),
    ), schemas.NVTX)
    ev = _with_content_ids(ev)
    unnamed = ev["domain"].null_count()
    if unnamed:
        adapter.note(
            f"{unnamed} NVTX events are in domains whose name was not captured (no domain-create "
            f"event); their domain is null"
        )
    # Nesting is computed on the same-thread ranges and written back by row position (a join
    # on range_id would hash every event once more).
    nests = ev.select((pl.col("style") != "mark") & pl.col("end_global_tid").is_null()
                      ).to_series()
    at = nests.arg_true().to_numpy().astype(np.int64)
    rows, depth, parent = _nesting(ev.filter(nests))
    found = np.zeros(ev.height, dtype=bool)
    found[at[rows]] = True
    depths = np.zeros(ev.height, dtype=np.int32)
    depths[at[rows]] = depth
    parents = np.full(ev.height, -1, dtype=np.int64)
    parents[at[rows]] = np.where(parent >= 0, at[rows[np.maximum(parent, 0)]], -1)
    has_parent = parents >= 0
    ev = ev.with_columns(
        depth=pl.Series(depths).set(pl.Series(~found), None),  # type: ignore[arg-type]
        parent_range_id=ev["range_id"].gather(np.maximum(parents, 0)).set(
            pl.Series(~has_parent), None  # type: ignore[arg-type]
        ),
    )
    return adapter.finish(ev, schemas.NVTX)


#: the content order that numbers NVTX events (module docstring, ``range_id``)
CONTENT_ORDER = (
    ("start_ns", False), ("end_ns", True), ("global_tid", False), ("end_global_tid", False),
    ("style", False), ("domain", False), ("name", False), ("category", False),
    ("payload_json", False), ("unterminated", False),
)


def _with_content_ids(ev: pl.DataFrame) -> pl.DataFrame:
    """``ev`` in content order with ``range_id`` = 1, 2, ... in that order."""
    keys = [c for c, _ in CONTENT_ORDER]
    desc = [d for _, d in CONTENT_ORDER]
    ev = content_sort(ev, keys[:2], descending=desc[:2], ties=keys)
    return ev.with_columns(range_id=pl.int_range(1, pl.len() + 1, dtype=pl.Int64))


def nest_ranges(ranges: pl.DataFrame) -> pl.DataFrame:
    """``depth`` and ``parent_range_id`` of same-thread ranges (rule in the module docstring).

    Needs ``range_id``, ``global_tid``, ``start_ns``, ``end_ns``; ranges with a null bound get
    neither. With rows in (thread, start, end desc, range_id) order, a range's parent is the
    nearest earlier row of its thread whose end is >= its own: a "previous greater or equal"
    search (`_previous_at_least`), done for all rows at once. Depth then follows by pointer
    jumping along parents. Both take O(log n) vectorised steps (the level-by-level window
    version took one step per nesting level, each with a ``.over`` of tens of thousands of
    groups).
    """
    rows, depth, parent = _nesting(ranges)
    ids = ranges["range_id"].cast(pl.Int64).gather(rows)
    return pl.DataFrame(
        {
            "range_id": ids,
            "depth": pl.Series(depth, dtype=pl.Int32),
            "parent_range_id": ids.gather(np.maximum(parent, 0)).set(
                pl.Series(parent < 0), None  # type: ignore[arg-type]
            ) if len(rows) else ids,
        }
    )


def _nesting(ranges: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`nest_ranges` as arrays: ``rows`` = the positions in ``ranges`` of the ranges with both
    bounds, in nesting order; ``depth`` and ``parent`` (a position in ``rows``, -1: none) per
    entry of ``rows``."""
    work = ranges.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("row"),
        pl.col("range_id").cast(pl.Int64),
        pl.col("global_tid").cast(pl.Int64).alias("group"),
        pl.col("start_ns").cast(pl.Int64),
        pl.col("end_ns").cast(pl.Int64),
    ).drop_nulls(["start_ns", "end_ns"])
    work = work.sort(["group", "start_ns", "end_ns", "range_id"],
                     descending=[False, False, True, False])
    n = work.height
    end = work["end_ns"].to_numpy()
    group = work["group"].to_numpy()
    pos = np.arange(n)
    first = np.ones(n, dtype=bool)
    first[1:] = group[1:] != group[:-1]
    group_start = np.maximum.accumulate(np.where(first, pos, 0)) if n else pos
    # the nearest earlier row of any thread: one of an earlier thread means none in its own
    parent = _previous_at_least(end)
    parent[parent < group_start] = -1
    # Pointer jumping: dist = edges from a row to anc; once anc is -1, dist is the depth.
    anc, dist = parent, (parent >= 0).astype(np.int64)
    while (anc >= 0).any():
        up = np.maximum(anc, 0)
        dist = np.where(anc >= 0, dist + dist[up], dist)
        anc = np.where(anc >= 0, anc[up], -1)
    return work["row"].to_numpy(), dist, parent


def _previous_at_least(values: np.ndarray) -> np.ndarray:
    """For every position ``i``, the largest ``j < i`` with ``values[j] >= values[i]`` (-1:
    none), for all positions at once in O(n) memory.

    A tree of maxima over aligned blocks (level k: the max of each block of 2^k values, 2n
    values in all) is searched from each position leftwards: climbing, the block of 2^k values
    that ends where the search stands is skipped when its max is smaller, and at most one block
    per level is looked at; the first block that holds a large enough value is then descended
    into, taking its right half whenever that half does. (A table of running maxima for every
    position and level held 22 arrays of the NVTX ranges of a 10M-kernel trace: 860 MB.)"""
    n = len(values)
    parent = np.full(n, -1, np.int64)
    if n < 2:
        return parent
    tree = [values]
    while len(tree[-1]) >= 2:
        below = tree[-1]
        pairs = len(below) // 2
        tree.append(np.maximum(below[0:2 * pairs:2], below[1:2 * pairs:2]))
    query = np.arange(1, n, dtype=np.int64)  # (the first position has nothing before it)
    bound = query.copy()  # positions below ``bound`` are still to search
    wanted = values[query]
    level = np.full(query.size, -1, np.int64)  # the level and index of the block found
    block = np.zeros(query.size, np.int64)
    active = np.arange(query.size)
    for k in range(len(tree)):
        # the search of a query stands at a multiple of 2^k: the block ending there, if any
        ends_here = ((bound[active] >> k) & 1).astype(bool)
        at = active[ends_here]
        index = (bound[at] >> k) - 1
        hit = tree[k][index] >= wanted[at]
        level[at[hit]] = k
        block[at[hit]] = index[hit]
        bound[at[~hit]] -= 1 << k
        still = np.ones(active.size, bool)
        still[np.flatnonzero(ends_here)[hit]] = False
        active = active[still]
        active = active[bound[active] > 0]
        if active.size == 0:
            break
    for k in range(len(tree) - 1, 0, -1):  # down to the rightmost value large enough
        at = np.flatnonzero(level == k)
        right = 2 * block[at] + 1
        block[at] = np.where(tree[k - 1][right] >= wanted[at], right, right - 1)
        level[at] = k - 1
    found = level == 0
    parent[query[found]] = block[found]
    return parent
