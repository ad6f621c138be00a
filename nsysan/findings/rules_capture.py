"""Rules about the profile itself: what was not captured, or captured badly."""

from __future__ import annotations

import polars as pl

from nsysan.escape import md_code
from nsysan.findings.context import Context, NotEvaluated
from nsysan.findings.evidence import (
    evidence,
    fmt_frac,
    fmt_ns,
    make_finding,
    metric,
    offender,
    ranked,
    window,
    windows_from,
)
from nsysan.frames.text import per_value
from nsysan.load.quality import RULES as QUALITY_RULES
from nsysan.passes import op_link
from nsysan.passes.base import Finding

#: Missing canonical frame -> (severity, what is lost). NVTX has its own code (NVTX_MISSING).
_MISSING_SEVERITY = {
    "gpu_ops": ("critical", "no GPU activity: nothing to analyse"),
    "cuda_api": ("warning", "no CUDA API calls: no gap causes, launch, sync or copy analysis"),
    "osrt": ("info", "no OS-runtime calls: gap causes cannot name OS waits"),
}
_GRAPH_LAUNCH_PREFIXES = ("cudaGraphLaunch", "cuGraphLaunch")
#: the name holds "graph" in any case: what the regex ``(?i)graph`` matches (no non-ASCII
#: character case-folds to one of these letters), at a third of the regex's cost (run on the
#: distinct names: `text.per_value`)
_GRAPH_NAME = pl.col("name").str.contains_any(["graph"], ascii_case_insensitive=True)


def nvtx_missing(ctx: Context) -> list[Finding]:
    """NVTX_MISSING: attribution unavailable because there are no NVTX ranges."""
    if not ctx.trace.has("nvtx"):
        why = ctx.trace.meta.missing.get("nvtx", "not captured")
        reason = (f"NVTX was not traced ({why}): record with `--trace=cuda,nvtx` and annotate "
                  "the code")
        n = 0
    else:
        n = ctx.trace.frame("nvtx").select((pl.col("style") != "mark").sum()).item()
        if n:
            return []
        reason = "the application emitted no NVTX ranges (NVTX was traced)"
    msg = f"Per-layer attribution is unavailable: {reason}."
    ev = evidence([metric("nvtx_ranges", "NVTX ranges", n, "count")])
    return [make_finding("NVTX_MISSING", "info", msg, ev)]


def nvtx_low_coverage(ctx: Context) -> list[Finding]:
    """NVTX_LOW_COVERAGE: share of GPU busy time inside any range."""
    p = ctx.params
    if not ctx.trace.has("nvtx") or not ctx.trace.frame("nvtx").select(
            (pl.col("style") != "mark").any()).item():
        raise NotEvaluated("the profile has no NVTX ranges")
    layers = ctx.need_table("layers")
    coverage = float(layers["exclusive_frac"].fill_null(0).sum()) if layers.height else 0.0
    if coverage >= p.nvtx_min_coverage:
        return []
    covered = int(layers["exclusive_gpu_ns"].fill_null(0).sum()) if layers.height else 0
    metrics = [
        metric("coverage_frac", "GPU busy time inside an NVTX range", coverage, "frac"),
        metric("covered_ns", "GPU time attributed to ranges", covered, "ns"),
        metric("n_layers", "distinct range names with GPU work", layers.height, "count"),
    ]
    msg = (f"Only {fmt_frac(coverage)} of GPU busy time falls inside an NVTX range; the rest "
           "cannot be attributed to a layer.")
    return [make_finding("NVTX_LOW_COVERAGE", "info", msg, evidence(metrics))]


def missing_tables(ctx: Context) -> list[Finding]:
    """CAPTURE_MISSING_TABLES: canonical frames the export did not have."""
    missing = {n: why for n, why in ctx.trace.meta.missing.items() if n in _MISSING_SEVERITY}
    if not missing:
        return []
    order = ("info", "warning", "critical")
    sev = max((_MISSING_SEVERITY[n][0] for n in missing), key=order.index)
    offenders = [offender("table", n, None, "count",
                          detail=f"{why}; {_MISSING_SEVERITY[n][1]}") for n, why in missing.items()]
    metrics = [metric("n_missing", "activity kinds not captured", len(missing), "count")]
    msg = ("Not captured: " + "; ".join(f"{n} ({_MISSING_SEVERITY[n][1]})" for n in missing)
           + ".")
    return [make_finding("CAPTURE_MISSING_TABLES", sev, msg, evidence(metrics, [], offenders))]


def graphs_without_nodes(ctx: Context) -> list[Finding]:
    """CUDA_GRAPH_NO_NODES: graph launches but no GPU op with a graph node id."""
    ops = ctx.need_frame("gpu_ops")
    api = ctx.need_frame("cuda_api")
    # the null count is metadata: when graph nodes were traced the API scan is skipped
    if ops["graph_node_id"].null_count() < ops.height:
        return []
    # prefix tests on the distinct API names (filtered inside a select: a filter of the whole
    # frame would expand its constant columns to every call, `nsysan.frames.trace`; every
    # column is kept, since the evidence ranks ties by them)
    is_launch = per_value(api, "name", pl.any_horizontal(
        [pl.col("name").str.starts_with(p) for p in _GRAPH_LAUNCH_PREFIXES]))
    launches = api.select(pl.all().filter(is_launch))
    if launches.is_empty():
        return []
    metrics = [
        metric("graph_launches", "CUDA graph launches", launches.height, "count"),
        metric("graph_node_ops", "GPU ops with a graph node id", 0, "count"),
    ]
    msg = (f"The host launched {launches.height} CUDA graphs, but no GPU op carries a graph "
           "node id: graph kernels were traced as whole graphs (or not at all), so GPU busy "
           "time and per-layer attribution are understated.")
    return [make_finding("CUDA_GRAPH_NO_NODES", "warning", msg,
                         evidence(metrics, windows_from(launches, "name", ctx.params.top_n)))]


def nvtx_unterminated(ctx: Context) -> list[Finding]:
    """NVTX_UNTERMINATED: ranges that never ended."""
    nvtx = ctx.need_frame("nvtx")
    bad = nvtx.select("name", "start_ns", "unterminated").filter(
        pl.col("unterminated").fill_null(False))
    if bad.is_empty():
        return []
    by = ranked(bad.group_by("name").agg(pl.len(), pl.col("start_ns").min()), "len",
                ctx.params.top_n)
    offenders = [offender("nvtx_range", nm or "(unnamed)", k, "count", count=k,
                          detail=f"first opened at {fmt_ns(t)}") for nm, k, t in by.iter_rows()]
    msg = (f"{bad.height} NVTX ranges end at the session end (never closed, or the capture "
           f"stopped inside them); e.g. {md_code(by['name'][0], 80)}.")
    metrics = [metric("n_unterminated", "unterminated ranges", bad.height, "count")]
    return [make_finding("NVTX_UNTERMINATED", "info", msg, evidence(metrics, [], offenders))]


def truncated(ctx: Context) -> list[Finding]:
    """CAPTURE_TRUNCATED: successful kernel launches with no GPU record."""
    p = ctx.params
    ctx.need_frame("gpu_ops")  # NotEvaluated when not captured
    api = ctx.need_frame("cuda_api")
    is_launch = (pl.col("api_class") == "launch") & (pl.col("return_value").fill_null(0) == 0)
    rows = op_link.api_rows(ctx.trace)
    # Every op's call is known (`op_link`): a launch is found when some op points at it, an
    # array lookup instead of an anti-join of the two largest frames. The launch calls are
    # one mask over the calls (the name test once per distinct name): only the columns of
    # the lost ones are copied, and only the start of the found ones is read.
    launched = op_link.launched(ctx.trace, rows)
    launch = api.select(is_launch & ~per_value(api, "name", _GRAPH_NAME)).to_series()
    n_launches = int(launch.sum())
    if not n_launches:
        raise NotEvaluated("no kernel launch calls in the trace")
    lost = api.select("name", "start_ns", "end_ns").filter(launch & ~launched)
    if lost.is_empty():
        return []
    # launches after the last launch that has its GPU record: work in flight at the stop
    found_max = api.select(pl.col("start_ns").filter(launch & launched).max()).item()
    last_found = -1 if found_max is None else int(found_max)
    tail = lost.filter(pl.col("start_ns") > last_found)
    inner = lost.height - tail.height
    inner_frac = inner / n_launches
    if inner_frac >= p.lost_warn_frac:
        sev = "warning"
        msg = (f"{inner} of {n_launches} kernel launches ({fmt_frac(inner_frac)}) have no "
               "GPU record although later GPU work was recorded: activity records were lost "
               "(CUPTI buffers dropped); GPU busy time is understated.")
    else:
        sev = "info"
        msg = (f"{lost.height} kernel launches have no GPU record"
               + (f", {tail.height} of them after the last launch with a GPU record: the capture "
                  "stopped with work in flight" if tail.height else "")
               + ".")
    by = ranked(lost.group_by("name").agg(pl.len()), "len", p.top_n)
    offenders = [offender("api", nm, k, "count", count=k) for nm, k in by.iter_rows()]
    metrics = [
        metric("n_launches", "kernel launch calls", n_launches, "count"),
        metric("n_lost", "launches without a GPU record", lost.height, "count"),
        metric("n_lost_at_end", "of which at the end of the capture", tail.height, "count"),
        metric("lost_frac", "share of launches lost before the end", inner_frac, "frac"),
    ]
    wins = [window(int(lost["start_ns"].min()), int(lost["end_ns"].max()),
                   "launches without GPU records")]
    return [make_finding("CAPTURE_TRUNCATED", sev, msg, evidence(metrics, wins, offenders))]


def data_quality(ctx: Context) -> list[Finding]:
    """CAPTURE_DATA_QUALITY: rows the data-quality rules (`nsysan.load.quality`) repaired or
    dropped in the frames this analysis read; severity by the share of a frame's rows that
    were impossible (lost), the worst frame deciding."""
    p = ctx.params
    quality = ctx.trace.meta.quality_summary()
    taken = [(frame, rule, e) for frame, q in quality.items() for rule, e in q["rules"].items()]
    notes = [f"{frame}: {note}" for frame, q in quality.items() for note in q["notes"]]
    if not taken and not notes:
        return []
    worst, worst_frame = 0.0, None
    for frame, q in quality.items():
        lost = sum(_lost_rows(rule, e) for rule, e in q["rules"].items())
        seen = q["rows"] + sum(e["rows"] for e in q["rules"].values() if e["action"] == "dropped")
        share = min(lost / seen, 1.0) if seen else 0.0
        if lost and (worst_frame is None or share > worst):
            worst, worst_frame = share, frame
    sev = ("critical" if worst >= p.quality_crit_frac
           else "warning" if worst >= p.quality_warn_frac else "info")
    by_rows = sorted(taken, key=lambda t: (-t[2]["rows"], t[0], t[1]))
    offenders = [
        offender("table", f"{frame}: {rule}", e["rows"], "count", count=e["rows"],
                 detail=f"{e['action']}: {QUALITY_RULES[rule].summary}" if rule in QUALITY_RULES
                 else e["action"])
        for frame, rule, e in by_rows[: p.top_n]
    ]
    metrics = [
        metric("n_dropped", "rows dropped",
               sum(e["rows"] for _, _, e in taken if e["action"] == "dropped"), "count"),
        metric("n_repaired", "values repaired (nulled, cut or defaulted)",
               sum(e["rows"] for _, _, e in taken if e["action"] != "dropped"), "count"),
        metric("lost_frac", "largest share of a frame's rows lost", worst, "frac"),
    ]
    what = "; ".join(f"{frame} {e['rows']} {rule} ({e['action']})" for frame, rule, e in by_rows)
    msg = (f"The export holds rows no capture can produce, handled by the data-quality rules "
           f"(docs/data-quality.md): {what or 'see the notes'}.")
    if worst_frame is not None:
        msg += (f" Impossible rows are {fmt_frac(worst)} of {worst_frame}: results describe "
                f"the remaining rows.")
    else:
        msg += " No timing was lost: the results equal those of a clean export."
    if notes:
        msg += " " + " ".join(notes)
    return [make_finding("CAPTURE_DATA_QUALITY", sev, msg, evidence(metrics, [], offenders))]


def _lost_rows(rule: str, entry: dict) -> int:
    """Rows whose timing or identity the rule lost: the lossy rules' rows, except NULLed
    timestamps (their row is then dropped, and counted, by ``missing_timestamp``)."""
    spec = QUALITY_RULES.get(rule)
    if spec is not None and spec.lossless:
        return 0
    if rule == "value_not_integer":
        columns = entry.get("columns", {})
        return sum(n for c, n in columns.items() if c.rsplit(".", 1)[-1] not in ("start", "end"))
    return int(entry["rows"])
