"""``findings.md``: the diagnosis for people, readable in a terminal and on a review page.

It opens with the verdict and the baseline block, then lists findings (most severe first) with
their evidence, advice and quick check, then per-layer attribution (or why it is unavailable),
the pictures, and what was checked and not found / not evaluated.

Strings from the trace never become markup (`nsysan.escape`): table cells, headings and list
items are `md_text`; finding messages are Markdown whose trace strings the rules put in code
spans (`md_code`); the input path is a code span too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from nsysan.escape import md_code, md_text
from nsysan.findings.catalogue import CATALOGUE, LAYER_TITLES
from nsysan.findings.evidence import fmt_frac, fmt_ns, fmt_value
from nsysan.frames.trace import Trace
from nsysan.passes.base import Finding
from nsysan.report.jsonout import atomic_write

FINDINGS_MD = "findings.md"
_MAX_CELL = 90


def _cell(text: Any, limit: int = _MAX_CELL) -> str:
    """A markdown table cell (or list item): one line of inert text, long names shortened."""
    return md_text(text, limit)


def _t(ns: int | None) -> str:
    """A point on the session timeline."""
    return "n/a" if ns is None else f"{ns / 1e9:.6f} s"


def _baseline(diagnosis: Any) -> list[str]:
    b = diagnosis.baseline
    lines = ["## Baseline", ""]
    if b.window_start_ns is not None:
        lines += [f"Analysed window: {_t(b.window_start_ns)} – {_t(b.window_end_ns)} "
                  f"({fmt_ns(b.window_end_ns - b.window_start_ns)}, {b.window_source}).", ""]
    lines += ["| metric | value | source |", "|---|---|---|"]
    for it in b.items:
        label = it.label + (f" [device {it.device_id}]" if it.device_id is not None else "")
        value = fmt_value(it.value, it.unit) if it.value is not None else "n/a"
        src = it.source if it.value is not None else f"{it.source}: {it.note}"
        if it.value is not None and it.note:
            src += f" ({it.note})"
        lines.append(f"| {_cell(label)} | {value} | {_cell(src)} |")
    return [*lines, ""]


def _verdict(diagnosis: Any) -> list[str]:
    v = diagnosis.verdict
    lines = [f"**Verdict: {v.label}.** {v.reason}", ""]
    if v.shares:
        parts = " · ".join(f"{k} {fmt_frac(s)}" for k, s in v.shares.items())
        lines += [f"Device time: {parts}", ""]
    return lines


def _finding(i: int, f: Finding) -> list[str]:
    spec = CATALOGUE.get(f.code)
    where = "".join([f", device {f.device_id}" if f.device_id is not None else "",
                     f", pid {f.pid}" if f.pid is not None else ""])
    lines = [f"### {i}. [{f.severity.upper()}] {md_text(f.title)} — {md_code(f.code)}", "",
             f"Layer: **{f.layer}**{where}", "", f.message, ""]
    ev = f.evidence or {}
    metrics = ev.get("metrics", [])
    if metrics:
        lines += ["| evidence | value |", "|---|---|"]
        lines += [f"| {_cell(m['label'])} | {fmt_value(m['value'], m['unit'])} |"
                  for m in metrics if m.get("value") is not None]
        lines.append("")
    windows = ev.get("windows", [])
    if windows:
        lines.append("Time windows (session time):")
        for w in windows:
            dev = f" device {w['device_id']}" if w.get("device_id") is not None else ""
            lines.append(f"- {_t(w['start_ns'])} – {_t(w['end_ns'])} "
                         f"({fmt_ns(w['end_ns'] - w['start_ns'])}){dev}: {_cell(w['label'])}")
        lines.append("")
    offenders = ev.get("offenders", [])
    if offenders:
        lines += ["| top offenders | kind | value | count | detail |", "|---|---|---|---|---|"]
        for o in offenders:
            lines.append(
                f"| {_cell(o['name'])} | {o['kind']} | {fmt_value(o['value'], o['unit'])} | "
                f"{'' if o.get('count') is None else o['count']} | {_cell(o.get('detail') or '')} |"
            )
        lines.append("")
    extra = ev.get("extra")
    if extra:
        lines += [f"Other evidence: {_cell(extra, 300)}", ""]
    if spec:
        lines += [f"**Advice:** {spec.advice}", "", f"**Quick check:** {spec.quick_check}", ""]
    return lines


def _layers(diagnosis: Any, layers: pl.DataFrame | None, images: Mapping[str, str]) -> list[str]:
    lines = ["## Per-layer attribution (NVTX)", ""]
    note = diagnosis.attribution_note()
    if note is not None or layers is None or layers.is_empty():
        return [*lines, note or "Per-layer attribution is unavailable: no NVTX range encloses "
                "GPU work.", ""]
    # stable: the layers table already breaks ties (by busy time, domain, name)
    top = layers.filter(pl.col("exclusive_gpu_ns") > 0).sort(
        "exclusive_gpu_ns", descending=True, maintain_order=True).head(15)
    lines += ["| layer | instances | GPU ops | exclusive GPU time | share | busy (union) |",
              "|---|---|---|---|---|---|"]
    for r in top.iter_rows(named=True):
        lines.append(f"| {_cell(r['name'], 60)} | {r['instances']} | {r['n_gpu_ops']} | "
                     f"{fmt_ns(r['exclusive_gpu_ns'])} | {fmt_frac(r['exclusive_frac'])} | "
                     f"{fmt_ns(r['gpu_busy_ns'])} |")
    cov = float(layers["exclusive_frac"].fill_null(0).sum())
    lines += ["", f"{layers.height} range names ({layers.height - top.height} not shown: "
              "outside the top 15 or enclosing no GPU time exclusively); NVTX ranges cover "
              f"{fmt_frac(cov)} of GPU busy time.", ""]
    if "layers_png" in images:
        lines += [f"![GPU time per layer]({images['layers_png']})", ""]
    return lines


_STATE_GROUPS = (  # how per-step overlap states are summarised, first match wins
    ("compute", r"compute"),
    ("exposed communication", r"nccl|p2p"),
    ("copies / memset only", r"h2d|d2h|d2d|memset"),
    ("idle", r"^idle$"),
)
_MAX_STEP_ROWS = 20


def _steps(steps: pl.DataFrame | None, overlap: pl.DataFrame | None) -> list[str]:
    """Per-step breakdown: where each step's device time went, step by step."""
    if steps is None or steps.is_empty():
        return []
    source = md_text(steps["source"][0])  # e.g. nvtx:<a name pattern from the trace>
    lines = ["## Steps", "", f"{steps.height} steps from {source}"
             f" ({int(steps['warmup'].sum())} warm-up). Per step, device time by engine state:", ""]
    if overlap is not None and not overlap.is_empty():
        group = pl.lit("other")
        for label, pattern in reversed(_STATE_GROUPS):
            group = pl.when(pl.col("state").str.contains(pattern)).then(pl.lit(label)).otherwise(
                group)
        # the patterns are tested once per distinct state, not once per row
        states = overlap.select(pl.col("state").unique().drop_nulls()).with_columns(
            group.alias("group"))
        of_state = dict(zip(states["state"].to_list(), states["group"].to_list(), strict=True))
        per_step = (
            overlap.filter(pl.col("step").is_not_null())
            .with_columns(pl.col("state").replace_strict(of_state, default="other",
                                                         return_dtype=pl.String).alias("group"))
            .group_by("step", "group").agg(pl.col("duration_ns").sum())
            .pivot(on="group", index="step", values="duration_ns")
            .fill_null(0)
        )
        groups = [g for g, _ in _STATE_GROUPS if g in per_step.columns]
        steady = steps.filter(~pl.col("warmup")).select("step")
        means = per_step.join(steady, on="step").select(groups).mean()
        if means.height:
            lines += ["| state (steady-state mean per step) | time |", "|---|---|"]
            lines += [f"| {g} | {fmt_ns(means[g][0])} |" for g in groups]
            lines.append("")
    else:
        per_step = None
    shown = steps.sort("step")
    if shown.height > _MAX_STEP_ROWS:  # warm-up steps, then the slowest steady ones
        shown = pl.concat([shown.filter(pl.col("warmup")),
                           shown.filter(~pl.col("warmup")).sort("duration_ns", descending=True,
                                                                maintain_order=True)
                           ]).head(_MAX_STEP_ROWS).sort("step")
    lines += ["| step | start | duration | GPU busy | idle | exposed NCCL | H2D not overlapped |",
              "|---|---|---|---|---|---|---|"]
    for r in shown.iter_rows(named=True):
        mark = " (warm-up)" if r["warmup"] else ""
        lines.append(f"| {r['step']}{mark} | {r['start_ns'] / 1e9:.6f} s | "
                     f"{fmt_ns(r['duration_ns'])} | {fmt_frac(r['gpu_busy_frac'])} | "
                     f"{fmt_ns(r['idle_ns'])} | {fmt_ns(r['exposed_nccl_ns'])} | "
                     f"{fmt_ns(r['h2d_unoverlapped_ns'])} |")
    if shown.height < steps.height:
        lines.append(f"\n{steps.height - shown.height} more steps (the fastest steady ones) are in "
                     "steps.parquet.")
    lines.append("")
    return lines


def _host(host: Mapping[str, pl.DataFrame] | None) -> list[str]:
    """Host threads (the host pass): the launching threads' sample layers, per step when steps
    are known (the thread with the most samples)."""
    threads = (host or {}).get("host_threads")
    per_layer = (host or {}).get("host_layers")
    if threads is None or per_layer is None or threads.is_empty():
        return []
    launchers = threads.filter((pl.col("role") == "launcher") & (pl.col("n_samples") > 0))
    if launchers.is_empty():
        return []
    layer_cols = [c for c in threads.columns if c.endswith("_frac")]
    lines = ["## Host threads (CPU sampling)", "",
             "| thread | on-CPU | switches | migrations | samples | top layers |",
             "|---|---|---|---|---|---|"]
    top = launchers.sort(["n_samples", "global_tid"], descending=[True, False])
    for r in top.head(_MAX_STEP_ROWS).iter_rows(named=True):
        shares = sorted(((r[c] or 0.0, c[:-5]) for c in layer_cols), reverse=True)
        best = ", ".join(f"{name} {fmt_frac(v)}" for v, name in shares[:3] if v > 0)
        who = md_text(r["name"] or "?") + f" (tid {r['tid']})"
        lines.append(f"| {who} | {fmt_ns(r['on_cpu_ns'])} | {r['n_switches']} | "
                     f"{r['n_migrations']} | {r['n_samples']} | {best} |")
    lines.append("")
    main = top.row(0, named=True)
    steps = per_layer.filter((pl.col("global_tid") == main["global_tid"])
                             & pl.col("step").is_not_null())
    if not steps.is_empty():
        wide = (steps.pivot(on="layer", index="step", values="frac", aggregate_function="sum")
                .sort("step"))
        order = [c for c in threads.columns if c.endswith("_frac")]  # host layer order
        shown = sorted((c for c in wide.columns if c != "step"),
                       key=lambda c: order.index(f"{c}_frac") if f"{c}_frac" in order else 99)
        wide = wide.with_columns(pl.col(shown).fill_null(0.0))
        counts = steps.group_by("step").agg(pl.col("n_samples").sum())
        wide = wide.join(counts, on="step").sort("step").head(_MAX_STEP_ROWS)
        lines += [f"Per step, the samples of {md_text(main['name'] or '?')} (tid "
                  f"{main['tid']}) by layer:", "",
                  "| step | samples | " + " | ".join(shown) + " |",
                  "|---|---|" + "---|" * len(shown)]
        for r in wide.iter_rows(named=True):
            lines.append(f"| {r['step']} | {r['n_samples']} | "
                         + " | ".join(fmt_frac(r[c]) for c in shown) + " |")
        lines.append("")
    return lines


def render_markdown(diagnosis: Any, trace: Trace, layers: pl.DataFrame | None = None,
                    images: Mapping[str, str] | None = None,
                    timelines: Sequence[tuple[int, str]] = (),
                    steps: pl.DataFrame | None = None,
                    overlap: pl.DataFrame | None = None,
                    host: Mapping[str, pl.DataFrame] | None = None) -> str:
    """The findings.md text. ``images`` maps ``layers_png`` / ``html`` to file names next to
    it; ``timelines`` lists ``(device_id, png name)``."""
    images = dict(images or {})
    counts = {s: sum(1 for f in diagnosis.findings if f.severity == s)
              for s in ("critical", "warning", "info")}
    lines = [f"# nsysan findings — {md_text(trace.trace_id)}", ""]
    lines += _verdict(diagnosis)
    lines += _baseline(diagnosis)
    lines += ["## Findings", "",
              f"{counts['critical']} critical, {counts['warning']} warning, {counts['info']} info"
              f" · input: {md_code(trace.meta.path)} (nsys export "
              f"{md_text(trace.meta.exporter_version or '?')}, schema "
              f"{md_text(trace.meta.schema_version or '?')})", ""]
    if diagnosis.findings:
        lines += ["| # | severity | code | layer | finding |", "|---|---|---|---|---|"]
        for i, f in enumerate(diagnosis.findings, 1):
            lines.append(f"| {i} | {f.severity} | {md_code(f.code)} | {f.layer} | "
                         f"{_cell(f.title)} |")
        lines.append("")
        for i, f in enumerate(diagnosis.findings, 1):
            lines += _finding(i, f)
    else:
        lines += ["No finding: nothing in this profile blocks the GPU beyond the thresholds.", ""]
    lines += _steps(steps, overlap)
    lines += _host(host)
    lines += _layers(diagnosis, layers, images)
    if timelines or "html" in images:
        lines += ["## Timeline", ""]
        for dev, png in timelines:
            lines += [f"![GPU utilisation, gaps and overlap states, device {dev}]({png})", ""]
        if "html" in images:
            lines += [f"Interactive version (hover for details): [{images['html']}]"
                      f"({images['html']})", ""]
    if diagnosis.not_found:
        lines += ["## Checked, nothing found", ""]
        lines += [f"- `{c}` ({LAYER_TITLES[CATALOGUE[c].layer].split(' (')[0]}): "
                  f"{CATALOGUE[c].nothing_found}" for c in diagnosis.not_found]
        lines.append("")
    if diagnosis.unavailable:
        lines += ["## Not evaluated", ""]
        lines += [f"- `{c}`: {diagnosis.reasons.get(c, '')}" for c in diagnosis.unavailable]
        lines.append("")
    lines += ["---", "Finding codes are documented in nsysan's docs/findings.md; thresholds: "
              "`nsysan.findings.FindingParams`."]
    return "\n".join(lines) + "\n"


def write_markdown(out_dir: Path, diagnosis: Any, trace: Trace,
                   layers: pl.DataFrame | None = None, images: Mapping[str, str] | None = None,
                   timelines: Sequence[tuple[int, str]] = (),
                   steps: pl.DataFrame | None = None,
                   overlap: pl.DataFrame | None = None,
                   host: Mapping[str, pl.DataFrame] | None = None) -> Path:
    text = render_markdown(diagnosis, trace, layers, images, timelines, steps, overlap, host)
    return atomic_write(Path(out_dir) / FINDINGS_MD, text)
