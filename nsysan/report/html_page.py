"""``report.html``: one self-contained interactive page (no CDN, no network request).

The text of the page — verdict, baseline, findings with their evidence, the tables — is
rendered here from the same `Diagnosis` that findings.md and findings.json render (one source
of truth: nothing is recomputed), every trace string through `html.escape`. The timeline is a
canvas drawn by ``assets/report.js`` (plain JavaScript, inlined) from the payload of
`nsysan.report.html_data`, embedded as JSON in which ``<``, ``>`` and ``&`` are escaped, so no
trace string can close the script element. Without JavaScript the page still shows the text,
the tables and the static SVG strips of `plots`.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from nsysan.findings.catalogue import CATALOGUE
from nsysan.findings.evidence import fmt_frac, fmt_ns, fmt_value, ranked
from nsysan.frames.trace import Trace
from nsysan.report.atomic import atomic_write

MAX_TABLE_ROWS = 500  # rows per table on the page (the Parquet tables have all of them)
esc = html.escape


def _asset(name: str) -> str:
    return resources.files("nsysan.report").joinpath("assets", name).read_text(encoding="utf-8")


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' survive as such."""
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _message(text: str) -> str:
    """A finding message (Markdown whose trace strings are code spans) as inert HTML: the
    code spans become <code>, everything is escaped."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: show the text as it is
        return esc(str(text))
    return "".join(f"<code>{esc(p)}</code>" if i % 2 else esc(p).replace("**", "")
                   for i, p in enumerate(parts))


def _t(ns: int | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e9:.6f} s"


def _finding(i: int, f: Any) -> str:
    ev = f.evidence or {}
    where = "".join([f", device {f.device_id}" if f.device_id is not None else "",
                     f", pid {f.pid}" if f.pid is not None else ""])
    out = [f"<div class='finding {esc(f.severity)}' id='finding-{i}'>"
           f"<h3>{i}. [{esc(f.severity.upper())}] {esc(f.title)} — <code>{esc(f.code)}</code>"
           f"</h3><p class='layer'>Layer: <b>{esc(f.layer)}</b>{esc(where)}</p>"
           f"<p>{_message(f.message)}</p>"]
    metrics = [m for m in ev.get("metrics", []) if m.get("value") is not None]
    if metrics:
        out.append("<table class='ev'><tr><th>evidence</th><th>value</th></tr>")
        out += [f"<tr><td>{esc(m['label'])}</td><td>{esc(fmt_value(m['value'], m['unit']))}"
                "</td></tr>" for m in metrics]
        out.append("</table>")
    windows = ev.get("windows", [])
    if windows:
        out.append("<p>Time windows (click to zoom the timeline):</p><ul class='windows'>")
        for k, w in enumerate(windows):
            dev = w.get("device_id")
            dev_attr = "" if dev is None else f" data-device='{int(dev)}'"
            out.append(
                f"<li><button class='win' data-finding='{i}' data-window='{k}' "
                f"data-t0='{int(w['start_ns'])}' data-t1='{int(w['end_ns'])}'{dev_attr} "
                f"data-label='{esc(str(w['label']))}'>{_t(w['start_ns'])} – {_t(w['end_ns'])}"
                f" ({fmt_ns(w['end_ns'] - w['start_ns'])})"
                f"{'' if dev is None else f' device {int(dev)}'}</button> "
                f"{esc(str(w['label']))}</li>")
        out.append("</ul>")
    offenders = ev.get("offenders", [])
    if offenders:
        out.append("<table class='ev'><tr><th>top offenders</th><th>kind</th><th>value</th>"
                   "<th>count</th><th>detail</th></tr>")
        out += [f"<tr><td>{esc(str(o['name']))}</td><td>{esc(o['kind'])}</td>"
                f"<td>{esc(fmt_value(o['value'], o['unit']))}</td>"
                f"<td>{'' if o.get('count') is None else int(o['count'])}</td>"
                f"<td>{esc(str(o.get('detail') or ''))}</td></tr>" for o in offenders]
        out.append("</table>")
    spec = CATALOGUE.get(f.code)
    if spec:
        out.append(f"<p><b>Advice:</b> {_message(spec.advice)}</p>"
                   f"<p><b>Quick check:</b> {_message(spec.quick_check)}</p>")
    out.append("</div>")
    return "".join(out)


#: table -> (title, [(column, header, kind)]) — kind: ns | frac | int | text | t (a time)
_TABLES = {
    "kernels": ("Kernels", "total_ns", [
        ("short_name", "kernel", "text"), ("op_class", "class", "text"),
        ("count", "count", "int"), ("total_ns", "total", "ns"), ("mean_ns", "mean", "ns"),
        ("max_ns", "max", "ns"), ("gpu_time_frac", "GPU time", "frac"),
        ("tensor_core", "tensor core", "text")]),
    "layers": ("Layers (NVTX)", "exclusive_gpu_ns", [
        ("name", "layer", "text"), ("instances", "instances", "int"),
        ("n_gpu_ops", "GPU ops", "int"), ("exclusive_gpu_ns", "exclusive", "ns"),
        ("exclusive_frac", "share", "frac"), ("gpu_busy_ns", "busy (union)", "ns")]),
    "steps": ("Steps", None, [
        ("step", "step", "int"), ("start_ns", "start", "t"), ("duration_ns", "duration", "ns"),
        ("warmup", "warm-up", "text"), ("gpu_busy_frac", "GPU busy", "frac"),
        ("idle_ns", "idle", "ns"), ("exposed_nccl_ns", "exposed NCCL", "ns")]),
    "gaps": ("Gaps (device)", "duration_ns", [
        ("device_id", "device", "int"), ("start_ns", "start", "t"),
        ("duration_ns", "duration", "ns"), ("cause", "cause", "text"),
        ("cause_detail", "detail", "text")]),
}


def _cell(v: Any, kind: str) -> str:
    if kind == "text":
        return f"<td>{esc('n/a' if v is None else str(v))}</td>"
    if v is None:
        return "<td data-v=''>n/a</td>"
    shown = {"ns": fmt_ns, "frac": fmt_frac, "t": _t}.get(kind, lambda x: f"{x:,}")(v)
    return f"<td data-v='{v!r}'>{esc(shown)}</td>"


def _table(name: str, df: pl.DataFrame | None) -> str:
    title, rank_by, cols = _TABLES[name]
    if df is None or df.is_empty():
        return f"<h3>{esc(title)}</h3><p>No rows.</p>"
    if name == "gaps":
        df = df.filter(pl.col("scope") == "device")
    present = [c for c in cols if c[0] in df.columns]
    d = (ranked(df, rank_by) if rank_by in df.columns
         else ranked(df, ["start_ns"], descending=False))
    shown = d.head(MAX_TABLE_ROWS)
    if name in ("steps", "gaps"):
        shown = ranked(shown, ["start_ns"], descending=False)
    which = "largest" if rank_by in df.columns else "first"
    more = (f" (the {MAX_TABLE_ROWS} {which} of {d.height}; all are in {name}.parquet)"
            if d.height > MAX_TABLE_ROWS else "")
    head = "".join(f"<th data-kind='{k}' title='click to sort'>{esc(h)}</th>"
                   for _, h, k in present)
    rows = []
    zoom = name in ("steps", "gaps") and {"start_ns", "end_ns"} <= set(d.columns)
    for r in shown.iter_rows(named=True):
        attr = ""
        if zoom and r["start_ns"] is not None and r["end_ns"] is not None:
            dev = r.get("device_id")
            attr = (f" class='zoom' data-t0='{int(r['start_ns'])}' data-t1='{int(r['end_ns'])}'"
                    + ("" if dev is None else f" data-device='{int(dev)}'"))
        rows.append(f"<tr{attr}>" + "".join(_cell(r[c], k) for c, _, k in present) + "</tr>")
    return (f"<h3>{esc(title)}{esc(more)}</h3><table class='sortable' data-table='{name}'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def render(diagnosis: Any, trace: Trace, tables: dict[str, pl.DataFrame],
           payload: dict[str, Any], static_svgs: list[tuple[int, str, str]],
           layers_svg: str | None) -> str:
    """The page as text (deterministic: the same inputs give the same bytes)."""
    return "".join(render_parts(diagnosis, trace, tables, payload, static_svgs, layers_svg))


def render_parts(diagnosis: Any, trace: Trace, tables: dict[str, pl.DataFrame],
                 payload: dict[str, Any], static_svgs: list[tuple[int, str, str]],
                 layers_svg: str | None) -> list[str]:
    """`render`'s text in pieces, for `atomic_write` to write one after the other (the raw
    ops are most of the page: it is never held twice, as one string and as bytes)."""
    v = diagnosis.verdict
    title = f"nsysan — {trace.trace_id}"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">",
        f"<title>{esc(title)}</title><style>{_asset('report.css')}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p class='verdict'><b>Verdict: {esc(v.label)}.</b> {esc(v.reason)}</p>",
    ]
    if v.shares:
        parts.append("<p>Device time: " + " · ".join(
            f"{esc(k)} {fmt_frac(s)}" for k, s in v.shares.items()) + "</p>")
    parts.append("<nav><a href='#timeline'>Timeline</a> · <a href='#findings'>Findings</a> · "
                 "<a href='#baseline'>Baseline</a> · <a href='#tables'>Tables</a></nav>")
    parts.append("<section id='timeline'><h2>Timeline</h2><p class='help'>Wheel: zoom · drag:"
                 " pan · double-click: whole trace · hover: details. Zoomed out, each lane "
                 "shows its busy share per bin; zoomed in, every op.</p>"
                 "<div id='tl-toolbar'><button id='tl-reset'>whole trace</button> "
                 "<span id='tl-range'></span></div><div id='tl-notes'></div>"
                 "<div id='tl-root'></div><div id='tl-tip' hidden></div>")
    parts.append("<noscript>")
    for dev, busy, svg in static_svgs:
        parts.append(f"<h3>Device {dev} — busy {esc(busy)}</h3>{svg}")
    parts.append("</noscript></section>")
    parts.append("<section id='findings'><h2>Findings</h2>")
    for i, f in enumerate(diagnosis.findings, 1):
        parts.append(_finding(i, f))
    if not diagnosis.findings:
        parts.append("<p>No finding.</p>")
    parts.append("</section><section id='baseline'><h2>Baseline</h2><table>")
    for it in diagnosis.baseline.items:
        dev = f" [device {it.device_id}]" if it.device_id is not None else ""
        val = fmt_value(it.value, it.unit) if it.value is not None else f"n/a ({it.note})"
        parts.append(f"<tr><td>{esc(it.label + dev)}</td><td>{esc(val)}</td></tr>")
    parts.append("</table></section><section id='tables'><h2>Tables</h2>"
                 "<p class='help'>Click a header to sort; click a step or gap row to zoom the "
                 "timeline to it.</p>")
    for name in _TABLES:
        parts.append(_table(name, tables.get(name)))
    parts.append("<h3>GPU time per NVTX layer</h3>")
    parts.append(layers_svg if layers_svg is not None else
                 f"<p>{esc(diagnosis.attribution_note() or 'No NVTX layers.')}</p>")
    parts.append("</section>")
    # The raw ops come last, after the code: the page draws its overview while the parser
    # still reads them (first paint does not grow with the number of ops).
    blob = payload.get("blob", "")
    small = {k: v for k, v in payload.items() if k != "blob"}
    parts.append(f"<script type='application/json' id='nsysan-data'>{_script_json(small)}"
                 "</script>")
    parts.append(f"<script>{_asset('report.js')}</script>")
    parts += ["<script type='application/octet-stream' id='nsysan-ops'>", blob,
              "</script></body></html>\n"]
    return parts


def write(path: Path, text: str | list[str]) -> Path:
    return atomic_write(path, text)
