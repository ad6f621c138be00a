"""The ``sched`` frame: on-CPU intervals per thread, from nsys' context switches.

``SCHED_EVENTS(start, cpu, isSchedIn, globalTid)`` holds one row per switch-in or switch-out
(recorded with ``--cpuctxsw``; exports from about schema 3.13 add ``threadState`` on
switches, read into ``out_state``). Pairing rule, per thread in time order (at one instant a
switch-out sorts before a switch-in, so a thread that leaves and returns at the same ns gets
two intervals, never a negative one):

- a switch-in starts an interval; the thread's next event ends it: a switch-out (the normal
  case) or another switch-in (a lost switch-out: the interval ends there, noted);
- a switch-out with no switch-in before it (the thread was running when recording began)
  closes an interval opened at the session start (``open_start``; ``min(0, switch-out)``);
- a switch-in with no later event is closed at the session end (``open_end``; the session
  duration, else the last switch of the trace), with a note;
- a switch-out that follows a switch-out (a lost switch-in) adds nothing (noted).

``cpu`` is the CPU of the interval's switch-in (of the switch-out for an opened interval).
Rows without a time or thread are dropped (``missing_timestamp``, counted).
"""

from __future__ import annotations

import polars as pl

from nsysan.frames import schemas, schemas_host
from nsysan.frames.conform import select_narrowed
from nsysan.frames.order import content_sort, content_sort_in_place
from nsysan.load.adapters import Adapter, pid_of, small_labels, tid_of

SCHED_TABLE = "SCHED_EVENTS"
#: built-in labels for thread states (nsys' ENUM_SAMPLING_THREAD_STATE numbering)
THREAD_STATES: dict[int, str] = {
    0: "unknown",
    1: "running",
    2: "interruptible",
    3: "uninterruptible",
    4: "stopped",
    5: "terminated",
    6: "unscheduled",
    7: "waiting",
    8: "os_runtime",
    9: "initialized",
    10: "transition",
}
STATE_ENUM = "ENUM_SAMPLING_THREAD_STATE"


def state_labels(adapter: Adapter, codes: pl.DataFrame, code: str, out: str) -> pl.DataFrame:
    """Add ``out`` = the snake_case label of the thread-state ``code`` column (its number as
    text when neither the export's enum nor the built-in one knows it), Categorical: each
    distinct code is labelled once, the rows join the few labels."""
    labels = adapter.enum_labels(STATE_ENUM, THREAD_STATES).rename({"id": code, "label": out})
    lookup = codes.select(pl.col(code).unique().drop_nulls()).join(
        labels, on=code, how="left").select(
        code, pl.coalesce(out, pl.col(code).cast(pl.String)).alias(out))
    lookup = lookup.with_columns(small_labels(lookup[out], schemas.THREAD_STATE, out))
    return codes.join(lookup, on=code, how="left", maintain_order="left")


def build_sched(adapter: Adapter) -> pl.DataFrame | None:
    if not adapter.has(SCHED_TABLE):
        return None
    quality = adapter.quality("sched")
    df = adapter.read(SCHED_TABLE, ["start", "cpu", "isSchedIn", "globalTid"],
                      {"threadState": pl.Int64()},
                      narrow={"cpu": schemas_host.SCHED["cpu"]})  # (copied and sorted on)
    valid = pl.col("start").is_not_null() & pl.col("globalTid").is_not_null()
    dropped = df.height - int(df.select(valid.sum()).item()) if df.height else 0
    if dropped:
        quality.add("missing_timestamp", dropped)
        df = df.filter(valid)
    if df.is_empty():
        return adapter.finish(df, schemas_host.SCHED)
    session_end = adapter.duration_ns
    if session_end is None:
        session_end = int(df["start"].max())
    df = content_sort(
        df.with_columns((pl.col("isSchedIn").fill_null(0) != 0).alias("_in")),
        ["globalTid", "start", "_in"], ties=["cpu", "threadState"],
    )
    same = pl.col("globalTid") == pl.col("globalTid").shift(-1)
    prev_same = pl.col("globalTid") == pl.col("globalTid").shift(1)
    df = df.with_columns(
        nxt_start=pl.when(same).then(pl.col("start").shift(-1)),
        nxt_in=pl.when(same).then(pl.col("_in").shift(-1)),
        nxt_state=pl.when(same).then(pl.col("threadState").shift(-1)),
        prev_in=pl.when(prev_same).then(pl.col("_in").shift(1)),
    )
    ins = df.filter(pl.col("_in")).select(
        "globalTid", "cpu",
        start_ns="start",
        end_ns=pl.col("nxt_start").fill_null(pl.max_horizontal(pl.col("start"),
                                                                pl.lit(session_end))),
        open_start=pl.lit(False),
        open_end=pl.col("nxt_start").is_null(),
        _state=pl.when(pl.col("nxt_in") == False).then(pl.col("nxt_state")),  # noqa: E712
        _lost=pl.col("nxt_in").fill_null(False),
    )
    opened = df.filter(~pl.col("_in") & pl.col("prev_in").is_null()).select(
        "globalTid", "cpu",
        start_ns=pl.min_horizontal(pl.col("start"), pl.lit(0)),
        end_ns="start",
        open_start=pl.lit(True),
        open_end=pl.lit(False),
        _state="threadState",
        _lost=pl.lit(False),
    )
    lost_in = int(df.select((~pl.col("_in") & (pl.col("prev_in") == False)).sum()).item())  # noqa: E712
    lost_out = int(ins["_lost"].sum())
    if lost_out or lost_in:
        adapter.note(
            f"sched: {lost_out} switch-in(s) without a switch-out before the next switch-in "
            f"(interval ended there) and {lost_in} switch-out(s) without a switch-in (ignored)"
        )
    out = pl.concat([ins, opened])
    n_open = int(out["open_end"].sum())
    if n_open:
        adapter.note(
            f"sched: {n_open} thread(s) never switched out after their last switch-in; "
            f"those on-CPU intervals are closed at the session end ({session_end} ns)"
        )
    out = state_labels(adapter, out, "_state", "out_state")
    out = select_narrowed(out, dict(
        global_tid="globalTid",
        pid=pid_of("globalTid"),
        tid=tid_of("globalTid"),
        cpu="cpu",
        start_ns="start_ns",
        end_ns="end_ns",
        open_start="open_start",
        open_end="open_end",
        out_state=pl.when(pl.col("_state").is_not_null()).then(pl.col("out_state")),
    ), schemas_host.SCHED)
    out = content_sort_in_place(out, ["global_tid", "start_ns", "end_ns"])  # (its own)
    return adapter.finish(out, schemas_host.SCHED)
