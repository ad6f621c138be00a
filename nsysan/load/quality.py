"""The data-quality contract for rows: every impossible row is handled by one rule, and counted.

An export can hold rows no capture can produce: an op that ends before it starts, a timestamp
that is NULL or text (SQLite is dynamically typed), a kernel eleven days after a one-second
session, a table written twice, two API rows for one launch. Each kind is handled here by one
documented rule (`RULES`) while the canonical frames are built, so every pass sees the same
repaired frames, and every row a rule touches is counted in ``TraceMeta.quality`` (shown in
manifest.json, ``nsysan schema`` and the CAPTURE_DATA_QUALITY finding). docs/data-quality.md
is the user's page; this module is the implementation and must say the same.

The rules of a frame apply in a fixed order and a row is counted by the first that takes it:
``unrecorded`` -> ``missing_timestamp`` -> ``outside_session`` -> ``negative_duration`` ->
``duplicate_row`` -> ``duplicate_correlation``. All are vectorised; on a clean export each costs
a few comparisons over the time columns and filters nothing (no frame is copied).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

#: longest text value kept whole, in UTF-8 bytes: names (kernel, NVTX, API: any StringIds
#: value) and every other text an adapter reads. The longest in the shared traces is 32,441
#: bytes (a process environment in StringIds; the longest kernel name is 6,874). Longer values
#: are cut in SQL as they are read (`nsysan.load.sqlite`), so a hostile 200 MB name is never
#: materialised: a cut keeps the first MAX_TEXT_BYTES + 1 bytes or fewer (up to a character
#: boundary) and appends `TRUNCATION_MARK`, so a cut value is longer than the bound and an
#: uncut one never is.
MAX_TEXT_BYTES = 1 << 16
#: the bound of the metadata tables, whose values are whole documents (a GPU-metrics YAML of
#: 182,898 bytes in TARGET_INFO_SYSTEM_ENV)
MAX_METADATA_TEXT_BYTES = 1 << 20
METADATA_TABLES = frozenset({"TARGET_INFO_SYSTEM_ENV", "META_DATA_CAPTURE", "META_DATA_EXPORT",
                             "EXPORT_META_DATA"})
TRUNCATION_MARK = "…"
#: timestamps at or beyond this magnitude (2**62 ns, 146 years) are outside every session,
#: whatever the export says; it also keeps `end - start` and `end + slack` far from overflow
ABSURD_NS = 1 << 62
#: slack around the recorded session [0, duration]: calls and kernels in flight when the
#: capture stopped end after it (seen: an OS-runtime call 48 ms, a kernel 0.24 ms after the
#: end), so only timestamps more than max(duration, 1 s) outside the session are impossible
MIN_SLACK_NS = 1_000_000_000
#: without a usable session length (no ANALYSIS_DETAILS, or timestamps shifted at export) the
#: window is the span of the central 98% of a frame's timestamps, widened by this many spans
DATA_SLACK_SPANS = 10
DATA_QUANTILE = 0.01


@dataclass(frozen=True)
class QualityRule:
    """One rule of the contract."""

    action: str  # dropped | nulled | truncated | defaulted
    #: True when the analysis of the repaired rows equals that of a clean capture (the rule
    #: removes exact copies or keeps every timestamp); such counts are never more than info
    lossless: bool
    summary: str  # what is detected and what is done, one sentence


RULES: dict[str, QualityRule] = {
    "unrecorded": QualityRule(
        "dropped", False,
        "GPU op with start = end = 0: CUPTI could not collect its timestamps"),
    "missing_timestamp": QualityRule(
        "dropped", False,
        "start (or a required end) is NULL or not an integer (text, real, blob): the row has "
        "no place on the timeline"),
    "outside_session": QualityRule(
        "dropped", False,
        "a timestamp lies outside the session the export records, by more than the slack"),
    "negative_duration": QualityRule(
        "dropped", False,
        "end < start: the duration is unknown (summing it would subtract time)"),
    "duplicate_row": QualityRule(
        "dropped", True,
        "an exact copy of another row (every column read is equal): one copy is kept"),
    "duplicate_correlation": QualityRule(
        "dropped", True,
        "several CUDA API rows for one (process, correlation id), e.g. cudaLaunchKernel and "
        "cudaLaunchKernel_v7000 nested: the innermost is kept, so each GPU op has one launch"),
    "conflicting_string_id": QualityRule(
        "dropped", False,
        "several StringIds values for one id: the smallest value (code point order) is kept"),
    "missing_string_id": QualityRule(
        "dropped", True, "a StringIds row whose id is NULL or not an integer: nothing refers "
        "to it"),
    "value_not_integer": QualityRule(
        "nulled", False,
        "a value in an integer column is text, a non-integral real or a blob: it is read as "
        "NULL (and a NULL timestamp then drops its row)"),
    "value_not_text": QualityRule(
        "nulled", False, "a value in a text column is a blob: it is read as NULL"),
    "text_truncated": QualityRule(
        "truncated", True,
        f"a text value longer than {MAX_TEXT_BYTES} bytes ({MAX_METADATA_TEXT_BYTES} in the "
        f"metadata tables) is cut there and ends with {TRUNCATION_MARK}"),
    "column_defaulted": QualityRule(
        "defaulted", True,
        "a column nsys always writes is absent (a third-party or trimmed export): it gets its "
        "documented default"),
}


@dataclass
class FrameQuality:
    """The counts of one frame (or of the StringIds lookup) while it is built."""

    rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, rule: str, rows: int, column: str | None = None) -> None:
        """Count ``rows`` rows (or values) taken by ``rule``; ``column`` names the raw
        ``TABLE.column`` for value and column rules."""
        if rows <= 0:
            return
        entry = self.rules.setdefault(rule, {"action": RULES[rule].action, "rows": 0})
        entry["rows"] += int(rows)
        if column is not None:
            columns = entry.setdefault("columns", {})
            columns[column] = columns.get(column, 0) + int(rows)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def to_dict(self, rows: int) -> dict[str, Any]:
        """JSON-ready, in a fixed order (rules and columns sorted); ``rows``: the frame's
        rows after the rules (so ``rows`` + the dropped rows = the rows the rules saw)."""
        rules = {}
        for name in sorted(self.rules):
            entry = dict(self.rules[name])
            if "columns" in entry:
                entry["columns"] = dict(sorted(entry["columns"].items()))
            rules[name] = entry
        return {"rows": int(rows), "rules": rules, "notes": list(self.notes)}


@dataclass(frozen=True)
class Session:
    """What the export says about its session: the length, when it can be trusted."""

    #: ``ANALYSIS_DETAILS.duration`` when positive and below `ABSURD_NS`, else None
    duration_ns: int | None
    #: timestamps were shifted at export (--ts-normalize / --ts-shift): not relative to zero
    shifted: bool = False

    @classmethod
    def of(cls, duration_ns: int | None, shifted: bool) -> Session:
        usable = duration_ns is not None and 0 < duration_ns < ABSURD_NS
        return cls(duration_ns if usable else None, shifted)

    def window(self) -> tuple[int, int] | None:
        """[lo, hi] every timestamp of an event must lie in, or None to derive it from data."""
        if self.duration_ns is None or self.shifted:
            return None
        slack = max(self.duration_ns, MIN_SLACK_NS)
        return max(-slack, -ABSURD_NS), min(self.duration_ns + slack, ABSURD_NS)


def data_window(starts: pl.Series, ends: pl.Series) -> tuple[int, int]:
    """The window of a frame whose session is unknown: the span of its central 98%
    (1st percentile of the starts to 99th of the ends, so < 1% outliers cannot move it),
    widened by `DATA_SLACK_SPANS` spans on each side, at least `MIN_SLACK_NS`."""
    sane_s = starts.filter(starts.abs() < ABSURD_NS)
    sane_e = ends.filter(ends.abs() < ABSURD_NS)
    if sane_s.is_empty():
        return -ABSURD_NS, ABSURD_NS
    lo = int(sane_s.quantile(DATA_QUANTILE, "lower"))  # type: ignore[arg-type]
    hi_src = sane_e if not sane_e.is_empty() else sane_s
    hi = int(hi_src.quantile(1 - DATA_QUANTILE, "higher"))  # type: ignore[arg-type]
    slack = max(DATA_SLACK_SPANS * max(hi - lo, 0), MIN_SLACK_NS)
    return max(lo - slack, -ABSURD_NS), min(hi + slack, ABSURD_NS)


def drop_impossible(
    df: pl.DataFrame,
    quality: FrameQuality,
    session: Session,
    *,
    start: str = "start",
    end: str = "end",
    ranged: pl.Expr | None = None,
) -> pl.DataFrame:
    """Drop the rows of ``df`` taken by ``missing_timestamp``, ``outside_session`` and
    ``negative_duration``, and count them.

    ``ranged``: which rows have an end that matters (NVTX: ranges, not marks); for those a NULL
    end is allowed (an unterminated range). None: every row needs an end.
    """
    if df.is_empty():
        return df
    s, e = pl.col(start), pl.col(end)
    if ranged is None:
        missing = s.is_null() | e.is_null()
        has_end = pl.lit(True)
    else:
        missing = s.is_null()
        has_end = ranged & e.is_not_null()
    window = session.window()
    if window is None:
        window = data_window(*_event_times(df, start, end, has_end))
    if ranged is None and _clean_times(df, window, s, e):
        return df
    flags = _flags(df, window, missing, has_end, s, e)
    counts = flags.sum().row(0)
    if session.window() is not None and counts[1] * 2 > df.height - counts[0]:
        # Most rows outside: the recorded session does not describe these timestamps (a
        # synthetic export, a wrong duration), so the rows are judged by their own span.
        quality.note(
            f"{counts[1]} of {df.height} rows lie outside the session the export records "
            f"(0 to {session.duration_ns} ns): their window was taken from the data instead")
        window = data_window(*_event_times(df.filter(~flags["m"]), start, end, has_end))
        flags = _flags(df, window, missing, has_end, s, e)
        counts = flags.sum().row(0)
    if not any(counts):
        return df
    for rule, n in zip(("missing_timestamp", "outside_session", "negative_duration"), counts,
                       strict=True):
        quality.add(rule, n)
    return df.filter(~(flags["m"] | flags["o"] | flags["n"]))


def _clean_times(df: pl.DataFrame, window: tuple[int, int], s: pl.Expr, e: pl.Expr) -> bool:
    """True when no row can be taken by a rule: the check of a clean frame, a few
    reductions instead of three flag columns."""
    lo, hi = window
    nulls, s_lo, s_hi, e_lo, e_hi, negative = df.select(
        (s.null_count() + e.null_count()).alias("a"), s.min().alias("b"), s.max().alias("c"),
        e.min().alias("d"), e.max().alias("e"), (e < s).any().alias("f"),
    ).row(0)
    return not nulls and not negative and lo <= s_lo and s_hi <= hi and lo <= e_lo and e_hi <= hi


def _flags(df: pl.DataFrame, window: tuple[int, int], missing: pl.Expr, has_end: pl.Expr,
           s: pl.Expr, e: pl.Expr) -> pl.DataFrame:
    """One boolean column per rule (m, o, n): each row is flagged by the first rule only."""
    lo, hi = window
    outside = ((s < lo) | (s > hi) | (has_end & ((e < lo) | (e > hi)))).fill_null(False)
    negative = (has_end & (e < s)).fill_null(False)
    return df.select(
        missing.alias("m"),
        (~missing & outside).alias("o"),
        (~missing & ~outside & negative).alias("n"),
    )


def _event_times(df: pl.DataFrame, start: str, end: str,
                 has_end: pl.Expr) -> tuple[pl.Series, pl.Series]:
    times = df.select(pl.col(start).drop_nulls().alias("s"))
    ends = df.select(pl.col(end).filter(has_end).drop_nulls().alias("e"))
    return times.to_series(), ends.to_series()


def drop_duplicate_rows(
    df: pl.DataFrame,
    quality: FrameQuality,
    *,
    start: str,
    columns: list[str] | None = None,
) -> pl.DataFrame:
    """Drop exact copies (``duplicate_row``): rows equal to an earlier row in every column of
    ``columns`` (default: all). The first copy in ``df``'s order is kept.

    Copies share their ``start`` (never NULL here: `drop_impossible` ran first), and on real
    traces few rows share one, so only those are compared in full; a frame where no start
    repeats (one sort of the column, free when it is sorted already) has none.
    """
    if df.height < 2:
        return df
    starts = df[start].sort()
    repeated = starts.filter(starts == starts.shift(1))
    if repeated.is_empty():
        return df
    rows = df.select(pl.col(start).is_in(repeated.unique().implode()).arg_true()).to_series()
    cols = columns or df.columns
    copies = df[rows].select(~pl.struct(cols).is_first_distinct()).to_series()
    n = int(copies.sum())
    if not n:
        return df
    quality.add("duplicate_row", n)
    return _without_rows(df, rows.filter(copies))


def drop_duplicate_correlations(
    df: pl.DataFrame, quality: FrameQuality, *, process: str, correlation: str, start: str,
    end: str, name: str,
) -> pl.DataFrame:
    """Keep one CUDA API row per (process, correlation id) (``duplicate_correlation``): the
    innermost (latest start, then earliest end, then smallest name, then the smallest values
    of the other columns in order, so that the row order of the export never decides), which
    is the call the GPU op was launched by; nsys's nvtxgpuproj counts the op once, as this
    leaves it."""
    dup = _duplicated_keys(df, process, correlation)
    if dup.is_empty():
        return df
    key = [process, correlation]
    order = [*key, start, end, name]
    order += [c for c in df.columns if c not in order]
    group = (
        df[dup].with_columns(_row=dup)
        .sort([*order, "_row"], descending=[c == start for c in [*order, "_row"]],
              nulls_last=True)
    )
    drop = group.filter(pl.struct(key).is_first_distinct().not_())["_row"]
    quality.add("duplicate_correlation", drop.len())
    return _without_rows(df, drop)


def _duplicated_keys(df: pl.DataFrame, process: str, correlation: str) -> pl.Series:
    """Positions of the rows whose (process, correlation) pair, both non-null, occurs more
    than once. A clean frame is told apart cheaply (hash-based duplicate tests cost ten times
    more on 1.8M calls): when the ids increase strictly in row order, or when no id occurs
    twice at all (one sort of the ids), no pair can repeat; only otherwise are pairs hashed,
    and then only those of the ids that repeat (in a capture of several processes the ids of
    different processes may collide)."""
    c = df[correlation]
    present = c.drop_nulls()
    none = pl.Series("_row", [], dtype=pl.UInt32)
    if present.len() < 2 or bool((present.diff().drop_nulls() > 0).all()):
        return none
    ordered = present.sort()
    if not bool((ordered == ordered.shift(1)).any()):
        return none
    rows = df.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), process,
                     correlation).filter(pl.col(correlation).is_duplicated()).drop_nulls()
    return rows.filter(pl.struct(process, correlation).is_duplicated())["_row"]


def _without_rows(df: pl.DataFrame, rows: pl.Series) -> pl.DataFrame:
    """``df`` without the rows at positions ``rows`` (few), order kept."""
    return df.filter(~pl.int_range(pl.len(), dtype=rows.dtype).is_in(rows.implode()))


def clean_strings(df: pl.DataFrame, quality: FrameQuality) -> pl.DataFrame:
    """StringIds (id, value) with one value per id: NULL ids dropped (``missing_string_id``),
    exact copies dropped (``duplicate_row``), and of several values for one id the smallest
    kept (``conflicting_string_id``): a rule that does not depend on the row order."""
    nulls = df["id"].null_count()
    if nulls:
        quality.add("missing_string_id", nulls)
        df = df.filter(pl.col("id").is_not_null())
    if df["id"].n_unique() == df.height:
        return df
    distinct = df.unique(["id", "value"], keep="first", maintain_order=True)
    quality.add("duplicate_row", df.height - distinct.height)
    one = (distinct.sort("id", "value", nulls_last=True, maintain_order=True)
           .unique("id", keep="first", maintain_order=True))
    quality.add("conflicting_string_id", distinct.height - one.height)
    return one


def text_limit(table: str) -> int:
    """The byte bound of the text columns of ``table`` (`MAX_TEXT_BYTES`, or
    `MAX_METADATA_TEXT_BYTES` for the metadata tables)."""
    return MAX_METADATA_TEXT_BYTES if table in METADATA_TABLES else MAX_TEXT_BYTES


def readable_sql(column: str, dtype: pl.DataType | None) -> str:
    """SQL that is true when ``column`` (quoted) holds a value the source can return as its
    declared type (``dtype``: Int64 for INTEGER, Float64 for REAL, String for TEXT, None for
    no type): SQLite is dynamically typed, so a column can hold values of any type."""
    readable = {pl.Int64(): "('integer', 'null')", pl.Float64(): "('integer', 'real', 'null')"}
    if dtype in readable:
        return f"typeof({column}) IN {readable[dtype]}"
    return f"typeof({column}) != 'blob'"  # text (and, untyped, numbers): anything but a blob


def bounded_sql(table: str, column: str, dtype: pl.DataType | None) -> str:
    """The SQL that reads ``column`` (quoted) of ``table`` without materialising a hostile
    value: a value of another type than the column's (`readable_sql`: text, a
    non-integral real or a blob in an INTEGER column, a blob in a TEXT column) is NULL (and
    counted by the source, then as ``value_not_integer`` or ``value_not_text``); text longer
    than the table's bound (`text_limit`) is cut on its bytes, read as a BLOB (the text
    ``substr`` stops at the first NUL, and real environment strings hold NULs), at a
    character boundary (`cut_point_sql`), and marked: so a cut value is longer than the
    bound, which is how `truncate_text` counts it."""
    readable = readable_sql(column, dtype)
    if dtype == pl.Int64() or dtype == pl.Float64():
        return f"CASE WHEN {readable} THEN {column} END"
    if dtype != pl.String() and dtype is not None:
        return column
    limit = text_limit(table)
    blob = f"CAST({column} AS BLOB)"
    cut = (f"CAST(substr({blob}, 1, {cut_point_sql(blob, limit)}) AS TEXT) || "
           f"'{TRUNCATION_MARK}'")
    return (f"CASE WHEN NOT ({readable}) THEN NULL WHEN typeof({column}) = 'text' AND "
            f"length({blob}) > {limit} THEN {cut} ELSE {column} END")


def cut_point_sql(blob: str, limit: int) -> str:
    """SQL for the number of leading bytes of ``blob`` (an SQL expression of type BLOB) that a
    cut keeps: the largest character boundary at or below ``limit + 1`` (a boundary after
    byte p: byte p + 1 is not a UTF-8 continuation byte 0x80-0xBF). `cut_text` is the same
    rule in Python."""

    def continuation(i: int) -> str:
        return f"(hex(substr({blob}, {i}, 1)) BETWEEN '80' AND 'BF')"

    cases = " ".join(f"WHEN NOT {continuation(p + 1)} THEN {p}"
                     for p in (limit + 1, limit, limit - 1))
    return f"CASE {cases} ELSE {limit - 2} END"


def cut_text(value: str, limit: int) -> str:
    """``value`` cut as `cut_point_sql` cuts it, with `TRUNCATION_MARK` appended."""
    raw = value.encode("utf-8", "surrogatepass")
    keep = limit + 1
    while keep > limit - 2 and keep < len(raw) and 0x80 <= raw[keep] <= 0xBF:
        keep -= 1
    return raw[:keep].decode("utf-8", "replace") + TRUNCATION_MARK


def truncate_text(series: pl.Series, limit: int, *, cut: bool) -> tuple[pl.Series, int]:
    """``series`` with every value longer than ``limit`` bytes cut (`cut_text`) and how many
    there are. ``cut=False``: the values were cut in SQL already (`cut_point_sql`), so they
    are only counted: a cut value is longer than the bound, an uncut one never is."""
    if series.dtype != pl.String or series.is_empty():
        return series, 0
    long = series.str.len_bytes() > limit
    n = int(long.sum())
    if not n or not cut:
        return series, n
    # the long values only (a few hostile ones), one by one: polars slices by characters
    at = long.arg_true()
    cuts = pl.Series([cut_text(v, limit) for v in series.gather(at).to_list()],
                     dtype=pl.String)
    return series.scatter(at, cuts), n
