"""Files of ``nsysan scaling -o OUT``: Parquet tables, scaling.md, scaling.json, a picture.

Written through `nsysan.report.targets.write_files` (kind ``scaling``): the ownership marker
and atomic replacement of `docs/outputs.md`, so an OUT holding other files is refused and a
second run replaces only what the first wrote.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from nsysan.compare.scaling import STATE_LABEL, ScalingResult, item_means
from nsysan.escape import md_code, md_text
from nsysan.report.targets import write_files

SCALING_FILES = ("scaling.md", "scaling.json", "scaling.parquet",
                 "scaling_decomposition.parquet", "scaling_steps.parquet",
                 "scaling_ranks.parquet", "scaling_collectives.parquet", "scaling.png")


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 1e6:.1f} ms"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def summary_lines(res: ScalingResult) -> list[str]:
    if not res.comparable:
        return ["not comparable:", *[f"  - {b}" for b in res.blockers]]
    lines = []
    for e in res.efficiency.iter_rows(named=True):
        ci = (f" [{_pct(e['ci_low'])}, {_pct(e['ci_high'])}]" if e["ci_low"] is not None
              else "")
        lines.append(f"{e['base']} ({e['base_gpus']} GPUs) -> {e['new']} ({e['new_gpus']} "
                     f"GPUs): efficiency {_pct(e['efficiency'])}{ci}, step "
                     f"{_ms(e['base_step_ns'])} -> {_ms(e['new_step_ns'])}, end-of-step gap "
                     f"{_ms(e['base_end_gap_ns'])} -> {_ms(e['new_end_gap_ns'])}")
    lines.append(res.verdict)
    return lines


def markdown(res: ScalingResult, top: int = 10) -> str:
    out = ["# nsysan scaling", ""]
    for para in res.verdict.split("\n\n"):
        out += [md_text(para), ""]
    out += ["## Runs", "",
           "| run | GPUs | ranks | nodes | steady steps | source |", "|---|---|---|---|---|---|"]
    for r in res.runs:
        out.append(f"| {md_text(r.run)} | {r.n_gpus} | {r.n_ranks} | "
                   f"{r.n_nodes if r.n_nodes is not None else 'unknown'} | "
                   f"{len(r.step_numbers)} | {md_code(r.source, 120, in_table=True)} |")
    out.append("")
    if res.blockers:
        out += ["## Not comparable", "", *[f"- {md_text(b)}" for b in res.blockers], ""]
    if res.notes:
        out += ["Notes:", "", *[f"- {md_text(n)}" for n in res.notes], ""]
    if not res.efficiency.is_empty():
        out += ["## Scaling efficiency", "",
                "| pair | mode | step time | throughput / GPU | efficiency | interval | "
                "end-of-step gap (comm) |", "|---|---|---|---|---|---|---|"]
        for e in res.efficiency.iter_rows(named=True):
            out.append(
                f"| {md_text(e['base'])} → {md_text(e['new'])} ({e['base_gpus']} → "
                f"{e['new_gpus']} GPUs) | {e['mode']} | {_ms(e['base_step_ns'])} → "
                f"{_ms(e['new_step_ns'])} | {e['base_throughput_per_gpu']:.3g} → "
                f"{e['new_throughput_per_gpu']:.3g} /s | **{_pct(e['efficiency'])}** | "
                f"{_pct(e['ci_low'])} – {_pct(e['ci_high'])} | "
                f"{_ms(e['base_end_gap_ns'])} ({_ms(e['base_end_gap_comm_ns'])}) → "
                f"{_ms(e['new_end_gap_ns'])} ({_ms(e['new_end_gap_comm_ns'])}) |")
        out.append("")
    if not res.decomposition.is_empty():
        out += ["## Where the step time went", "",
                "Per pair, mean time per step and rank; each partition sums to the change of "
                "step time.", "",
                "| pair | by | item | base | new | change | share |",
                "|---|---|---|---|---|---|---|"]
        for by in ("state", "layer"):
            part = res.decomposition.filter(pl.col("by") == by)
            for d in part.group_by("base", "new", maintain_order=True).head(top).iter_rows(
                    named=True):
                item = STATE_LABEL.get(d["item"], d["item"]) if by == "state" else d["item"]
                out.append(f"| {md_text(d['base'])} → {md_text(d['new'])} | {by} | "
                           f"{md_text(item)} | {_ms(d['base_ns_per_step'])} | "
                           f"{_ms(d['new_ns_per_step'])} | "
                           f"{d['delta_ns_per_step'] / 1e6:+.1f} ms | "
                           f"{_pct(d['share_of_delta'])} |")
        out.append("")
    if not res.ranks.is_empty():
        out += ["## Ranks that cost the most", "",
                "| pair | rank | host | step | end-of-step gap | idle growth | arrived last | "
                "wait imposed / step (sum over others) |", "|---|---|---|---|---|---|---|---|"]
        worst = res.ranks.sort(["wait_imposed_ns_per_step", "idle_growth_ns", "rank"],
                               descending=[True, True, False], nulls_last=True).head(top)
        for r in worst.iter_rows(named=True):
            out.append(f"| {md_text(r['base'])} → {md_text(r['run'])} | {r['rank']} | "
                       f"{md_text(r['hostname'] or 'unknown')} | {_ms(r['step_ns'])} | "
                       f"{_ms(r['end_gap_ns'])} | {_ms(r['idle_growth_ns'])} | {r['n_last']} "
                       f"| {_ms(r['wait_imposed_ns_per_step'])} |")
        out.append("")
    if not res.collectives.is_empty():
        out += ["## Collectives", "",
                "| run | op | per step | time / step | exposed / step | transfer | message | "
                "bus bandwidth | rated link | share |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in res.collectives.iter_rows(named=True):
            size = ("unknown" if c["message_bytes"] is None
                    else f"{c['message_bytes'] / 2**20:.1f} MiB")
            bw = ("n/a" if c["transfer_busbw_gbps"] is None
                  else f"{c['transfer_busbw_gbps']:.1f} GB/s")
            rated = ("unknown" if c["rated_gbps"] is None
                     else f"{c['rated_gbps']:.0f} GB/s {c['scope']} ({c['rated_from']})")
            out.append(f"| {md_text(c['run'])} | {md_text(c['op'])} | {c['n_per_step']:.2f} | "
                       f"{_ms(c['duration_ns_per_step'])} | {_ms(c['exposed_ns_per_step'])} | "
                       f"{_ms(c['transfer_ns'])} | {size} | {bw} | {md_text(rated)} | "
                       f"{_pct(c['link_share'])} |")
        out.append("")
    if res.findings:
        out += ["## Findings", "", *[f"- **{f.code}** ({f.severity}): {md_text(f.message)}"
                                     for f in res.findings], ""]
    s = res.params.stats
    out += ["## Method", "",
            "Efficiency = throughput per GPU of NEW / that of BASE (weak scaling: step time "
            "ratio). Per-step samples (the mean over ranks of each common steady step) are "
            f"bootstrapped ({s.n_boot} resamples) for the {s.confidence:.0%} interval. Engine "
            "states and layers are measured per rank and step on each rank's device. "
            "Bus bandwidth uses the transfer time (first end minus last arrival). See "
            "docs/scaling.md.", ""]
    return "\n".join(out)


def picture_png(res: ScalingResult) -> bytes | None:
    """Two panels: step time by engine state per run (stacked), and the change by state."""
    if res.efficiency.is_empty():
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(1, 2)
    colors = {"compute": "#1565c0", "communication": "#c62828", "copies": "#6a1b9a",
              "idle": "#9e9e9e"}
    labels = [f"{r.run}\n{r.n_gpus} GPUs" for r in res.runs]
    bottoms = [0.0] * len(res.runs)
    for state, color in colors.items():
        vals = []
        for r in res.runs:
            m = item_means(r).filter((pl.col("by") == "state") & (pl.col("item") == state))
            vals.append(float(m["ns"][0]) / 1e6 if m.height else 0.0)
        ax.bar(range(len(vals)), vals, bottom=bottoms, color=color,
               label=STATE_LABEL[state])
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax.set_xticks(range(len(labels)), labels, fontsize=8, parse_math=False)
    ax.set_ylabel("ms per step (mean over ranks)")
    ax.legend(fontsize=7)
    ax.set_title("step time by engine state", fontsize=9)
    first = res.efficiency.row(0, named=True)
    dec = res.decomposition.filter((pl.col("by") == "state") & (pl.col("base") == first["base"])
                                   & (pl.col("new") == first["new"]))
    names = [STATE_LABEL[s] for s in dec["item"].to_list()]
    ms = [v / 1e6 for v in dec["delta_ns_per_step"].to_list()]
    ax2.barh(range(len(ms)), ms, color=["#c62828" if v > 0 else "#2e7d32" for v in ms])
    ax2.set_yticks(range(len(ms)), names, fontsize=8, parse_math=False)
    ax2.axvline(0, color="#424242", linewidth=0.8)
    ax2.set_xlabel("change of time per step (ms)")
    ax2.set_title(f"{first['base']} → {first['new']}: efficiency {first['efficiency']:.0%}",
                  fontsize=9, parse_math=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def scaling_json(res: ScalingResult) -> str:
    return json.dumps(res.to_dict(), indent=2, sort_keys=True, default=str)


def _parquet(df: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd")
    return buf.getvalue()


def write_scaling(res: ScalingResult, out_dir: str | Path,
                  inputs: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Write the scaling files into ``out_dir`` (see the module docstring)."""
    steps = (pl.concat([r.steps for r in res.runs]) if res.runs else pl.DataFrame())
    files: dict[str, bytes | str] = {
        "scaling.parquet": _parquet(res.efficiency),
        "scaling_decomposition.parquet": _parquet(res.decomposition),
        "scaling_steps.parquet": _parquet(steps),
        "scaling_ranks.parquet": _parquet(res.ranks),
        "scaling_collectives.parquet": _parquet(res.collectives),
        "scaling.json": scaling_json(res) + "\n",
        "scaling.md": markdown(res) + "\n",
    }
    png = picture_png(res)
    if png is not None:
        files["scaling.png"] = png
    return write_files(out_dir, files, kind="scaling", names=SCALING_FILES, inputs=inputs)
