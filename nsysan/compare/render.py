"""Files and text of a diff: diff.md (with a picture of the decomposition), diff.json,
diff.parquet (one row per metric and statistic) and diff_decomposition.parquet."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl

from nsysan.compare.diff import DiffResult
from nsysan.escape import md_cell, md_code, md_text
from nsysan.findings.evidence import fmt_frac, fmt_ns
from nsysan.report.jsonout import _clean, atomic_write
from nsysan.report.targets import write_files

DIFF_FILES = ("diff.md", "diff.json", "diff.parquet", "diff_decomposition.parquet",
              "diff_decomposition.png")
_MARK = {"improved": "improved", "regressed": "**regressed**", "unchanged": "unchanged",
         "not comparable": "_not comparable_"}
_SECTIONS = (("Run-wide", None), ("Engine states", "state"), ("GPU idle by cause", "idle"),
             ("Layers (NVTX)", "layer"), ("NCCL", "nccl"), ("Kernels", "kernel"))


def fmt_value(v: float | None, unit: str, *, signed: bool = False) -> str:
    """A metric value with its unit, for people."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    v = v + 0.0  # no "-0"
    sign = "+" if signed and v > 0 else ""
    if unit == "ns":
        return sign + fmt_ns(v)
    if unit == "frac":  # a change of a fraction is in percentage points
        return f"{100 * v:+.2g} pp" if signed else fmt_frac(v)
    if unit == "count":
        return f"{sign}{v:.3g}" if abs(v) < 1000 else f"{sign}{v:,.0f}"
    return f"{sign}{v:.4g}" + ("/s" if unit == "1/s" else f" {unit}")


def _rel(r: dict[str, Any]) -> str:
    rel = r["rel_delta"]
    return "" if rel is None else f"{100 * rel:+.1f}%"


def _ci(r: dict[str, Any]) -> str:
    if r["ci_low"] is None:
        return "—"
    return f"[{fmt_value(r['ci_low'], r['unit'], signed=True)}, " \
           f"{fmt_value(r['ci_high'], r['unit'], signed=True)}]"


def _label(r: dict[str, Any]) -> str:
    # metric keys hold selectors from the trace (layer, kernel, NCCL op names)
    return (md_code(r["metric"], in_table=True)
            + ("" if r["stat"] in ("mean", "value") else f" ({md_text(r['stat'])})"))


def summary_lines(res: DiffResult) -> list[str]:
    """A few lines for the terminal / CI log."""
    c = res.counts()
    lines = [f"{res.base.trace_id} -> {res.new.trace_id}: {res.verdict()} "
             f"({c['regressed']} regressed, {c['improved']} improved, {c['unchanged']} "
             f"unchanged, {c['not comparable']} not comparable)"]
    for reason in res.check.blockers:
        lines.append(f"  not comparable: {reason}")
    step = res.row("step_time_ns")
    if step is not None and step["delta"] is not None:
        lines.append(f"  step time {fmt_value(step['base'], 'ns')} -> "
                     f"{fmt_value(step['new'], 'ns')} ({_rel(step)}, {step['verdict']})")
        for by in ("state", "layer"):
            top = res.decomposition.filter(pl.col("by") == by).head(3)
            parts = [f"{r['item']} {fmt_value(r['delta_ns_per_step'], 'ns', signed=True)}"
                     for r in top.iter_rows(named=True) if r["delta_ns_per_step"]]
            if parts:
                lines.append(f"  by {by}: " + ", ".join(parts))
    return lines


def _decomposition_md(res: DiffResult, top: int) -> list[str]:
    step = res.row("step_time_ns")
    if step is None or step["delta"] is None:
        why = step["reason"] if step is not None else "no step time on one side"
        return ["## Where the time went", "", f"No decomposition: {why}.", ""]
    out = ["## Where the time went", "",
           f"Mean step time {fmt_value(step['base'], 'ns')} → {fmt_value(step['new'], 'ns')} "
           f"({fmt_value(step['delta'], 'ns', signed=True)}, {_rel(step)} per step).", "",
           "![decomposition of the step-time change](diff_decomposition.png)", ""]
    for by, title in (("state", "By engine state"), ("layer", "By layer (and GPU idle cause)")):
        d = res.decomposition.filter(pl.col("by") == by)
        if d.is_empty():
            continue
        shown = d.head(top)
        out += [f"### {title}", "", "| item | base / step | new / step | change | share |",
                "|---|---|---|---|---|"]
        for r in shown.iter_rows(named=True):
            item = md_text(r["item"]) + (" _(idle)_" if r["kind"] == "idle" else "")
            share = "" if r["share_of_delta"] is None else fmt_frac(r["share_of_delta"])
            out.append(f"| {item} | {fmt_value(r['base_ns_per_step'], 'ns')} | "
                       f"{fmt_value(r['new_ns_per_step'], 'ns')} | "
                       f"{fmt_value(r['delta_ns_per_step'], 'ns', signed=True)} | {share} |")
        if d.height > top:
            out.append(f"| … {d.height - top} more in diff_decomposition.parquet | | | | |")
        out.append("")
    return out


def _metrics_md(res: DiffResult, top: int) -> list[str]:
    out = ["## Metrics", "",
           "Verdicts account for noise: see *Method* below. Every row is in diff.parquet.", ""]
    for title, kind in _SECTIONS:
        d = res.rows.filter(pl.col("kind").is_null() if kind is None else pl.col("kind") == kind)
        if d.is_empty():
            continue
        if kind is not None:  # changes first, then by size of the change
            d = d.sort([pl.col("verdict").is_in(["improved", "regressed"]),
                        pl.col("delta").abs().fill_null(-1)], descending=[True, True],
                       maintain_order=True)  # stable: ties keep the metric order
        out += [f"### {title}", "", "| metric | base | new | change | CI of change | verdict |",
                "|---|---|---|---|---|---|"]
        for r in d.head(top if kind is not None else d.height).iter_rows(named=True):
            verdict = _MARK[r["verdict"]]
            if r["verdict"] == "not comparable" and r["reason"]:
                verdict += f": {md_cell(r['reason'])}"  # its trace strings are code spans
            change = fmt_value(r["delta"], r["unit"], signed=True)
            if r["rel_delta"] is not None:
                change += f" ({_rel(r)})"
            out.append(f"| {_label(r)} | {fmt_value(r['base'], r['unit'])} | "
                       f"{fmt_value(r['new'], r['unit'])} | {change} | {_ci(r)} | {verdict} |")
        if kind is not None and d.height > top:
            out.append(f"| … {d.height - top} more rows in diff.parquet | | | | | |")
        out.append("")
    return out


def _findings_md(res: DiffResult) -> list[str]:
    def codes(fs: list[dict[str, Any]]) -> dict[str, str]:
        # read back from an output directory's findings.json: text, never markup
        return {f["code"]: f"{md_code(f['code'])} ({md_text(f['severity'])})" for f in fs}

    a, b = codes(res.base.info.findings), codes(res.new.info.findings)
    new = [b[k] for k in sorted(set(b) - set(a))]
    gone = [a[k] for k in sorted(set(a) - set(b))]
    if not new and not gone:
        return []
    out = ["## Findings", ""]
    if new:
        out.append(f"- new in NEW: {', '.join(new)}")
    if gone:
        out.append(f"- resolved (only in BASE): {', '.join(gone)}")
    return [*out, ""]


def markdown(res: DiffResult, top: int = 15) -> str:
    c = res.counts()
    a, b = res.base.info, res.new.info
    sim = res.check.kernel_mix_similarity
    out = [f"# nsysan diff: {md_text(res.base.trace_id)} → {md_text(res.new.trace_id)}", "",
           f"**{res.verdict()}** — {c['regressed']} regressed, {c['improved']} improved, "
           f"{c['unchanged']} unchanged, {c['not comparable']} not comparable.", "",
           "| | BASE | NEW |", "|---|---|---|",
           f"| source | {md_code(res.base.source, in_table=True)} | "
           f"{md_code(res.new.source, in_table=True)} |",
           f"| steady-state steps | {a.n_steps} of {a.n_steps_all} | {b.n_steps} of "
           f"{b.n_steps_all} |",
           f"| step boundaries | {md_text(a.steps_source or 'none')} | "
           f"{md_text(b.steps_source or 'none')} |",
           f"| exporter | {md_text(a.exporter_version or 'unknown')} | "
           f"{md_text(b.exporter_version or 'unknown')} |",
           f"| CUDA graph trace | {md_text(a.graph_mode or 'unknown')} | "
           f"{md_text(b.graph_mode or 'unknown')} |",
           "",
           "Kernel-mix similarity (workload signature): "
           + ("unknown" if sim is None else f"{sim:.2f}") + ".", ""]
    if res.check.blockers or res.check.scopes:
        out += ["## Not comparable", ""]
        # reasons are Markdown whose trace strings are code spans (`comparability`)
        out += [f"- **everything**: {md_cell(r)}" for r in res.check.blockers]
        out += [f"- {md_text(scope)} metrics: {md_cell(r)}"
                for scope, r in sorted(res.check.scopes.items())]
        out.append("")
    if res.check.notes:
        out += ["Notes:", "", *[f"- {md_cell(n)}" for n in res.check.notes], ""]
    out += _decomposition_md(res, top)
    out += _metrics_md(res, top)
    out += _findings_md(res)
    s = res.params.stats
    out += ["## Method", "",
            f"Per-step samples of each run are bootstrapped ({s.n_boot} resamples, steps "
            f"resampled independently per run); a change is **significant** when the "
            f"{100 * s.confidence:.0f}% interval of the difference excludes 0 and **relevant** "
            f"when it is at least max({100 * s.min_effect:g}% of BASE, a floor: "
            f"{100 * s.min_step_frac:g}% of BASE step time for times per step, "
            f"{s.frac_floor:g} for fractions, {s.count_floor:g} for counts). Metrics without "
            "per-step samples use the threshold only. See docs/diff.md.", ""]
    return "\n".join(out)


def decomposition_png(res: DiffResult, path: Path, top: int = 12) -> Path | None:
    """Two panels of horizontal bars: change per step by engine state, and by layer."""
    png = decomposition_png_bytes(res, top)
    return None if png is None else atomic_write(path, png)


def decomposition_png_bytes(res: DiffResult, top: int = 12) -> bytes | None:
    """The picture of `decomposition_png` as PNG bytes (None without a decomposition)."""
    d = res.decomposition
    if d.is_empty():
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    step = res.row("step_time_ns")
    states = d.filter(pl.col("by") == "state")
    if step is not None and step["delta"] is not None:  # the total, on top of its parts
        states = pl.concat([states.head(0).vstack(pl.DataFrame(
            [{"by": "state", "item": "step time (total)", "kind": "total",
              "base_ns_per_step": step["base"], "new_ns_per_step": step["new"],
              "delta_ns_per_step": step["delta"], "share_of_delta": 1.0}],
            schema=states.schema)), states])
    layers = d.filter(pl.col("by") == "layer").head(top)
    n = max(states.height, layers.height, 3)
    fig = Figure(figsize=(12, 0.35 * n + 1.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for ax, part, title in ((axes[0], states, "by engine state"),
                            (axes[1], layers, "by layer / GPU idle cause")):
        part = part.reverse()
        labels = [f"idle: {s}" if k == "idle" else s
                  for s, k in zip(part["item"].to_list(), part["kind"].to_list(), strict=True)]
        names = [s if len(s) <= 45 else s[:44] + "…" for s in labels]
        ms = [v / 1e6 for v in part["delta_ns_per_step"].to_list()]
        colors = ["#616161" if k == "total" else "#c62828" if v > 0 else "#2e7d32"
                  for k, v in zip(part["kind"].to_list(), ms, strict=True)]
        ax.barh(range(len(ms)), ms, color=colors)
        # names come from the trace: "$...$" must not be parsed as mathtext (a bad formula
        # raised while drawing)
        ax.set_yticks(range(len(ms)), names, fontsize=7, parse_math=False)
        ax.axvline(0, color="#424242", linewidth=0.8)
        ax.set_xlabel("change of time per step (ms); red = slower")
        ax.set_title(title, fontsize=9)
    total = "" if step is None or step["delta"] is None else \
        f": step time {fmt_value(step['delta'], 'ns', signed=True)} per step"
    fig.suptitle(f"{res.base.trace_id} → {res.new.trace_id}{total}", fontsize=10,
                 parse_math=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def diff_json(res: DiffResult) -> str:
    """The diff.json document (NaN and infinities as null)."""
    return json.dumps(_clean(res.to_dict()), indent=2, ensure_ascii=False, allow_nan=False)


def _legacy_diff(folder: Path) -> frozenset[str] | None:
    """The diff files an nsysan of before output markers wrote into ``folder`` (recognised by
    its diff.json), or None."""
    try:
        doc = json.loads((folder / "diff.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(doc, dict) and {"base", "new", "metrics", "decomposition"} <= set(doc)):
        return None
    return frozenset(n for n in DIFF_FILES if (folder / n).is_file())


def write_diff(res: DiffResult, out_dir: str | Path, top: int = 15,
               inputs: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Write the diff files into ``out_dir`` (a folder of the user's, made when absent);
    returns their paths. A diff file already there is replaced only when nsysan wrote it
    (`nsysan.report.ownership.write_files`); ``out_dir`` may not be, hold or lie in any of
    ``inputs`` (`nsysan.errors.OutputError`, nothing written)."""
    files: dict[str, bytes | str] = {}
    for name, df in (("diff.parquet", res.rows), ("diff_decomposition.parquet",
                                                   res.decomposition)):
        buf = io.BytesIO()
        df.write_parquet(buf, compression="zstd")
        files[name] = buf.getvalue()
    files["diff.json"] = diff_json(res) + "\n"
    png = decomposition_png_bytes(res)
    if png is not None:
        files["diff_decomposition.png"] = png
    files["diff.md"] = markdown(res, top) + "\n"
    return write_files(out_dir, files, kind="diff", names=DIFF_FILES, inputs=inputs,
                       legacy=_legacy_diff)
