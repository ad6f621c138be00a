"""What every rule needs, derived once: pass tables, the analysed window, device time, and the
classification of device idle time.

The **analysed window** is the steady state: the span of the non-warm-up steps when the steps
pass found steps, else the whole GPU span. Count-based rules (allocations, copies, syncs) use a
**count window** that, without steps, also skips the first ``warmup_frac_without_steps`` of the
GPU span, because warm-up allocates and uploads on purpose.

Device idle time in the window is split into a partition (each idle nanosecond counted once):
- gaps of at least ``short_gap_max_ns``: the gaps pass's rows, by their ``cause``;
- shorter gaps (between kernels), classified here: ``sync`` when the gap starts while a process
  using the device is blocked in a synchronising API, ``copy`` when it starts while the host is
  blocked in a pageable or synchronous copy to/from the device, ``launch`` when the launch
  call of the op that ends the gap returned only after the device went idle (the host had not
  submitted it yet: the GPU waited for the launch), else ``other``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import polars as pl

from nsysan.findings import startup, streams
from nsysan.findings.params import FindingParams
from nsysan.frames import intervals
from nsysan.frames.order import strictly_increasing
from nsysan.frames.packed_keys import Keys
from nsysan.frames.text import per_value
from nsysan.frames.trace import Trace
from nsysan.passes import op_link
from nsysan.passes.base import PassResult
from nsysan.passes.distinct import distinct

#: Which pass writes which table (for "not evaluated" reasons).
TABLE_PASS = {
    "gaps": "gaps", "gap_summary": "gaps", "overlap": "overlap", "overlap_summary": "overlap",
    "steps": "steps", "attribution": "attribution", "layers": "attribution",
    "kernels": "kernels",
}

#: Gap causes that mean "the host was busy with something other than feeding the GPU"
#: (synchronous / pageable copies have their own finding).
HOST_SIDE_CAUSES = ("nvtx_range", "osrt_wait", "no_cuda_activity")
#: Idle category of each long-gap cause (see `Context.idle_breakdown`); else "other".
CAUSE_CATEGORY = {
    "nvtx_range": "input", "osrt_wait": "input", "no_cuda_activity": "input",
    "sync_copy": "copy", "launch_bound": "launch", "sync_api": "sync",
    "profiler_overhead": "other",
}


def _by_start(df: pl.DataFrame) -> pl.DataFrame:
    """``df.sort("start_ns")``, not sorted again when the starts already strictly increase
    (the gaps of a one-device trace come so): without ties every sort gives that order."""
    return df if strictly_increasing(df, ["start_ns"]) else df.sort("start_ns")


class NotEvaluated(Exception):  # a control-flow signal, not an error
    """Raised by a rule whose inputs are missing; the message is the reason shown to users."""


class NotApplicable(Exception):  # a control-flow signal, not an error
    """Raised by a rule over an optional capture that the trace lacks (memory-usage events):
    the rule is left out of the report altogether, so such traces read as before the rule
    existed; where the capture is reported missing says so (the baseline's memory line)."""


#: the ``kind`` of `Context.short_gaps` (an Enum: millions of rows on a 10M-kernel trace)
SHORT_GAP_KINDS = pl.Enum(["copy", "launch", "other", "startup", "sync"])


def _short_gap_kind(kind: str) -> pl.Expr:
    return pl.lit(kind, dtype=SHORT_GAP_KINDS)


@dataclass
class Context:
    trace: Trace
    results: Mapping[str, PassResult]
    params: FindingParams = field(default_factory=FindingParams)

    # ------------------------------------------------------------------ inputs
    @cached_property
    def tables(self) -> dict[str, pl.DataFrame]:
        return {n: df for r in self.results.values() for n, df in r.tables.items()}

    def table(self, name: str) -> pl.DataFrame | None:
        return self.tables.get(name)

    def need_table(self, name: str) -> pl.DataFrame:
        df = self.table(name)
        if df is None:
            raise NotEvaluated(f"the {TABLE_PASS.get(name, name)} pass did not run "
                               f"(no `{name}` table)")
        return df

    def need_frame(self, name: str) -> pl.DataFrame:
        if not self.trace.has(name):
            why = self.trace.meta.missing.get(name, "not captured")
            raise NotEvaluated(f"`{name}` not captured ({why})")
        return self.trace.frame(name)

    def metric(self, key: str) -> object | None:
        for r in self.results.values():
            if key in r.metrics:
                return r.metrics[key]
        return None

    # ------------------------------------------------------------------ steps and windows
    @cached_property
    def steady_steps(self) -> pl.DataFrame | None:
        """Non-warm-up steps (all steps when every step is flagged warm-up), or None."""
        steps = self.table("steps")
        if steps is None or steps.is_empty():
            return None
        steady = steps.filter(~pl.col("warmup").fill_null(False))
        return (steady if not steady.is_empty() else steps).sort("start_ns")

    @property
    def n_steps(self) -> int | None:
        return None if self.steady_steps is None else self.steady_steps.height

    @cached_property
    def gpu_span(self) -> tuple[int, int] | None:
        ops = self.trace.frame("gpu_ops") if self.trace.has("gpu_ops") else None
        if ops is None or ops.is_empty():
            return None
        row = ops.select(pl.col("start_ns").min(), pl.col("end_ns").max()).row(0)
        return int(row[0]), int(row[1])

    @cached_property
    def window(self) -> tuple[int, int] | None:
        """The analysed (steady-state) window on the session timeline."""
        if self.steady_steps is not None:
            s = self.steady_steps
            return int(s["start_ns"].min()), int(s["end_ns"].max())
        return self.gpu_span

    @property
    def window_source(self) -> str:
        if self.steady_steps is not None:
            return f"{self.n_steps} steady-state steps"
        return "whole GPU span (no steps found)"

    @cached_property
    def count_window(self) -> tuple[int, int] | None:
        if self.steady_steps is not None or self.window is None:
            return self.window
        t0, t1 = self.window
        return t0 + int((t1 - t0) * self.params.warmup_frac_without_steps), t1

    def in_window(self, df: pl.DataFrame, win: tuple[int, int] | None = None) -> pl.DataFrame:
        """Rows whose start lies in the window."""
        win = win or self.window
        if win is None:
            return df.clear()
        return df.filter((pl.col("start_ns") >= win[0]) & (pl.col("start_ns") < win[1]))

    # ------------------------------------------------------------------ device time by state
    @cached_property
    def state_time(self) -> dict[str, int] | None:
        """ns per overlap state in the window, summed over devices (None without overlap)."""
        ov = self.table("overlap")
        if ov is None:
            return None
        rows = ov.filter(pl.col("step").is_null())
        if self.steady_steps is not None:
            per_step = ov.filter(pl.col("step").is_in(self.steady_steps["step"].implode()))
            if not per_step.is_empty():
                rows = per_step
        agg = rows.group_by("state").agg(pl.col("duration_ns").sum())
        return {s: int(d) for s, d in agg.iter_rows()}

    @cached_property
    def device_time_ns(self) -> int:
        """Sum over devices of the window ∩ the device's GPU span."""
        if self.state_time:
            return sum(self.state_time.values())
        if self.window is None or not self.trace.has("gpu_ops"):
            return 0
        t0, t1 = self.window
        spans = self.trace.frame("gpu_ops").group_by("device_id").agg(
            pl.col("start_ns").min().clip(lower_bound=t0).alias("a"),
            pl.col("end_ns").max().clip(upper_bound=t1).alias("b"),
        )
        return int(spans.select((pl.col("b") - pl.col("a")).clip(lower_bound=0).sum()).item())

    def state_share(self, include: str, exclude: str | None = "compute") -> tuple[int, float]:
        """(ns, share of device time) of states that contain ``include`` and not ``exclude``."""
        st = self.state_time or {}
        ns = sum(d for s, d in st.items()
                 if include in s.split("+") and (exclude is None or exclude not in s.split("+")))
        total = self.device_time_ns
        return ns, (ns / total if total else 0.0)

    # ------------------------------------------------------------------ idle classification
    @cached_property
    def long_gaps(self) -> pl.DataFrame | None:
        """Device-scope gaps of the gaps pass, >= short_gap_max_ns, starting in the window,
        with ``category`` (input | copy | sync | launch | startup | other).

        The category is the cause's (`CAUSE_CATEGORY`), except that a gap the gaps pass could
        only call ``no_cuda_activity`` is ``sync`` (``copy``) when it starts while the host is
        blocked in a synchronising call (a pageable / synchronous copy): the host drained the
        queue there, so whatever it did next left the GPU idle."""
        gaps = self.table("gaps")
        if gaps is None:
            return None
        g = self.in_window(gaps.filter((pl.col("scope") == "device")
                                       & (pl.col("duration_ns") >= self.params.short_gap_max_ns)))
        cat = pl.col("cause").replace_strict(CAUSE_CATEGORY, default="other")
        if self.trace.has("gpu_ops") and self.trace.has("cuda_api") and g.height:
            g = self._tag_blocked(g.sort("start_ns"))
            g = g.with_columns(startup.is_startup(self.startup_calls, g))
            unexplained = pl.col("cause") == "no_cuda_activity"
            # a gap a start-up call covers is a one-off cost, whatever else the host did
            cat = (pl.when(pl.col("_startup")).then(pl.lit("startup"))
                   .when(unexplained & pl.col("_in_sync")).then(pl.lit("sync"))
                   .when(unexplained & pl.col("_in_copy")).then(pl.lit("copy")).otherwise(cat))
            return (g.with_columns(cat.alias("category"))
                    .drop(["_in_sync", "_in_copy", "_startup"]))
        return g.with_columns(cat.alias("category"))

    @cached_property
    def startup_calls(self) -> pl.DataFrame:
        """The start-up calls of the trace (`nsysan.findings.startup`). Needs cuda_api."""
        return startup.startup_calls(self.trace, self.params.startup_min_call_ns)

    @cached_property
    def sync_calls(self) -> pl.DataFrame:
        """The synchronising CUDA API calls of the whole trace (``api_class == "sync"``):
        ``pid, name, start_ns, end_ns``, in trace order. Needs cuda_api (callers check).

        Found once for the short-gap classification and HOST_SYNC_IN_STEP, and only these
        columns gathered (the filter of every column of two million calls cost twice this)."""
        return (self.trace.frame("cuda_api").lazy().filter(pl.col("api_class") == "sync")
                .select(["pid", "name", "start_ns", "end_ns"]).collect())

    @cached_property
    def _blocking_calls(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Per device, the union of host calls that block until the device drains: sync APIs
        of every process using the device, and pageable / synchronous copies to/from it."""
        ops = self.trace.frame("gpu_ops")
        # the (pid, device) pairs, made distinct on one packed column
        pid_dev = distinct(ops.select("pid", "device_id")).lazy()
        syncs = (self.sync_calls.lazy().select(["pid", "start_ns", "end_ns"])
                 .join(pid_dev, on="pid"))
        copies = (self.bad_copies.lazy().filter(pl.col("api_start").is_not_null())
                  .select(["device_id", pl.col("api_start").alias("start_ns"),
                           pl.col("api_end").alias("end_ns")]))
        # sorted by device then start, as `streams.starts_inside` needs (`intervals.union`)
        s, c = pl.collect_all([intervals.union(syncs, by=["device_id"]),
                               intervals.union(copies, by=["device_id"])])
        return s, c

    def _tag_blocked(self, gaps: pl.DataFrame) -> pl.DataFrame:
        """Add ``_in_sync`` / ``_in_copy``: the gap starts inside a blocking host call."""
        syncs, copies = self._blocking_calls
        return gaps.with_columns(pl.Series("_in_sync", streams.starts_inside(gaps, syncs)),
                                 pl.Series("_in_copy", streams.starts_inside(gaps, copies)))

    @cached_property
    def short_gaps(self) -> pl.DataFrame:
        """Device idle gaps < short_gap_max_ns in the window, ``kind``
        sync|copy|launch|startup|other, sorted by start.

        Needs gpu_ops and cuda_api (callers check). Columns: device_id (UInt32, as in the
        frames), start_ns, end_ns, kind: held through every rule, it has one row per gap
        between kernels (millions on a 10M-kernel trace), so the rules take the rows of one
        kind with the table's columns from `short_gaps_of`."""
        p = self.params
        # the complement of the busy union that the timeline pictures share (streams)
        gaps = (streams.gaps_between(streams.busy_blocks(self.trace)).lazy()
                .with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
                .filter(pl.col("duration_ns") < p.short_gap_max_ns))
        win = self.window
        if win is not None:
            gaps = gaps.filter((pl.col("start_ns") >= win[0]) & (pl.col("end_ns") <= win[1]))
        tagged = self._tag_blocked(_by_start(gaps.collect()))
        # Only gaps that are neither sync nor copy need the launch test, so the launch calls
        # are looked up for those alone (a fraction of them on traces full of synchronous
        # copies) and scattered back into place.
        rows = tagged.select(pl.arg_where(~pl.col("_in_sync") & ~pl.col("_in_copy")))
        rows = rows.to_series()
        api_end = pl.repeat(None, tagged.height, dtype=pl.Int64, eager=True).scatter(
            rows, self._launch_end(tagged[rows]))
        late = pl.col("_api_end").is_not_null() & (pl.col("_api_end") > pl.col("start_ns"))
        # (Enum literals, not text cast afterwards: a String per gap held ~50 B a gap at once)
        kind = (pl.when(pl.col("_in_sync")).then(_short_gap_kind("sync"))
                .when(pl.col("_in_copy")).then(_short_gap_kind("copy"))
                .when(late & pl.col("_startup")).then(_short_gap_kind("startup"))
                .when(late).then(_short_gap_kind("launch")).otherwise(_short_gap_kind("other")))
        return (tagged.with_columns(api_end.alias("_api_end"),
                                    startup.is_startup(self.startup_calls, tagged))
                .select(["device_id", "start_ns", "end_ns", kind.alias("kind")]))

    def short_gaps_of(self, kind: str) -> pl.DataFrame:
        """The `short_gaps` of one ``kind``: device_id (Int64, as in the gaps table),
        start_ns, end_ns, duration_ns."""
        return self.short_gaps.filter(pl.col("kind") == kind).select(
            pl.col("device_id").cast(pl.Int64), "start_ns", "end_ns",
            (pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"),
        )

    def _launch_end(self, gaps: pl.DataFrame) -> pl.Series:
        """Per gap, the earliest return of the launch calls of the ops that start exactly at
        its end (null when none).

        launch: had the host submitted the op(s) that end the gap when the GPU went idle? A
        launch call submits the work by the time it returns, so the GPU waited for the host
        when the earliest of those calls returned after the gap had started. The ops are
        matched to the gap ends on one packed Int64 (device, time) key (two-column joins cost
        several times more on 1M-kernel traces) and to their calls through `op_link`."""
        ends = gaps.select(["device_id", pl.col("end_ns").alias("start_ns")])
        rows = op_link.api_rows(self.trace)
        api = self.trace.frame("cuda_api")
        ops = self.trace.frame("gpu_ops")
        # Only ops starting at some gap's end can match: an Int64 set test cuts the million
        # ops down before any key is packed or any call is looked up.
        at_end = pl.col("start_ns").is_in(ends["start_ns"].implode())
        # every op's call is known (`op_link`): gather its return
        ops = (ops.select(["device_id", "start_ns"]).with_columns(pl.Series("_row", rows))
               .filter(at_end & (pl.col("_row") >= 0)).drop_nulls())
        ops = ops.with_columns(op_link.gather(api["end_ns"], ops["_row"]).alias("_api_end"))
        at = Keys([ops, ends], ["device_id"], ["start_ns"])
        end_key = at.pack(1, "start_ns").alias("_at")
        # the earliest return per end key: a binary search per op
        return streams.min_at(end_key, at.pack(0, "start_ns"), ops["_api_end"])

    def can_classify_short_gaps(self) -> None:
        self.need_frame("gpu_ops")
        self.need_frame("cuda_api")
        if self.window is None:
            raise NotEvaluated("no GPU activity in the trace")

    @cached_property
    def idle_breakdown(self) -> dict[str, int]:
        """Idle ns in the window: input | copy | launch | sync | startup | other |
        unclassified.

        ``launch``, ``sync`` and ``copy`` come from short gaps and long gaps with those causes;
        ``input`` from long gaps with host-side causes; ``unclassified`` is idle time the
        overlap table shows but no gap class explains (e.g. gaps between short_gap_max_ns and
        the gaps pass threshold)."""
        out = {"input": 0, "copy": 0, "launch": 0, "sync": 0, "startup": 0, "other": 0}
        if self.long_gaps is not None and not self.long_gaps.is_empty():
            agg = self.long_gaps.group_by("category").agg(pl.col("duration_ns").sum())
            for cat, ns in agg.iter_rows():
                out[cat] += int(ns)
        try:
            self.can_classify_short_gaps()
            sg = self.short_gaps.group_by("kind").agg(
                (pl.col("end_ns") - pl.col("start_ns")).sum())
            for kind, ns in sg.iter_rows():
                out[kind] += int(ns)
        except NotEvaluated:
            pass
        idle = (self.state_time or {}).get("idle")
        if idle is not None:
            out["unclassified"] = max(0, idle - sum(out.values()))
        return out

    # ------------------------------------------------------------------ copies
    @cached_property
    def bad_copies(self) -> pl.DataFrame:
        """Pageable copies and synchronous cudaMemcpy calls (whole trace), one row per copy:
        device_id, start_ns, end_ns (GPU), api_name, api_start, api_end, copy_kind,
        src_kind, dst_kind, bytes, why (pageable | sync). Needs gpu_ops and cuda_api."""
        p = self.params
        ops = self.trace.frame("gpu_ops")
        api = self.trace.frame("cuda_api")
        cols = ["device_id", "start_ns", "end_ns", "global_pid", "correlation_id", "copy_kind",
                "src_kind", "dst_kind", "bytes"]
        is_copy = pl.col("kind") == "memcpy"
        rows = op_link.api_rows(self.trace)
        # Every op's call is known (`op_link`): the copies' memcpy calls are a gather, not a
        # join of every copy with every memcpy call (the left join's result).
        # (the copies are few: gathered by row number, not a filter of every column)
        at = ops.select(pl.arg_where(is_copy)).to_series()
        copies = ops.select(cols)[at].with_columns(pl.Series("_row", rows[at.to_numpy()]))
        call = copies.select(pl.when(op_link.gather(api["api_class"], copies["_row"])
                                     == "memcpy").then(pl.col("_row")).otherwise(-1))
        call = call.to_series()
        j = copies.select(cols).with_columns(
            op_link.gather(api["name"], call).alias("api_name"),
            op_link.gather(api["start_ns"], call).alias("api_start"),
            op_link.gather(api["end_ns"], call).alias("api_end"),
        )
        # (the regex once per distinct call name)
        is_async = per_value(j, "api_name", pl.col("api_name").str.contains("(?i)async"))
        j = j.lazy()
        pageable = ((pl.col("src_kind") == "pageable")
                    | (pl.col("dst_kind") == "pageable")).fill_null(False)
        # nsys's cuda-sync-memcpy rule: small H2D uploads and same-device copies are fine
        small_h2d = ((pl.col("copy_kind") == "HtoD")
                     & (pl.col("bytes") <= p.copy_small_h2d_bytes)).fill_null(False)
        sync_call = (pl.col("api_name").is_not_null() & ~is_async & ~small_h2d
                     & (pl.col("copy_kind") != "DtoD")).fill_null(False)
        return j.filter(pageable | sync_call).with_columns(
            pl.when(pageable).then(pl.lit("pageable")).otherwise(pl.lit("sync")).alias("why")
        ).collect()

    def exposed_ns(self, subset: pl.DataFrame) -> int:
        """GPU time of ``subset`` (device_id, start_ns, end_ns) not overlapped by compute:
        |subset ∪ compute| − |compute| per device, summed.

        Computed as |∪subset| − |∪subset ∩ ∪compute| against the compute union of the whole
        trace (memoised: compute outside the subset's span intersects nothing), so only the
        small subset is merged here."""
        return streams.exposed_ns(self.trace, subset)
