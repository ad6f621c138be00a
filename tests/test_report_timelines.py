"""The timeline lanes (`plots.device_timelines`) are what the direct definition gives: one
union per overlap class (an op without one, a null op_class, counts as compute), compute ∪ nccl
measured from the compute and nccl blocks equals the union of those ops, and only present
classes are cut."""

from __future__ import annotations

import html

import numpy as np
import polars as pl
import pytest
from findings_cases import scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.findings.evidence import fmt_frac, fmt_ns
from nsysan.frames import intervals
from nsysan.frames.schemas import OVERLAP_CLASS_OF_OP_CLASS
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks
from nsysan.passes.device_blocks import covered_before
from nsysan.report import plots
from nsysan.report.plots import DeviceTimeline

blocks_st = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)).map(
    lambda t: (t[0], t[0] + t[1])), max_size=20)


def _union(rows: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    df = pl.DataFrame(rows, schema={"start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row")
    u = intervals.union(df, by=[]).collect()
    return u["start_ns"].to_numpy(), u["end_ns"].to_numpy()


@settings(max_examples=200, deadline=None)
@given(blocks_st, blocks_st, st.lists(st.integers(-10, 360), min_size=1, max_size=15))
def test_covered_by_both_is_the_union_of_both(a, b, ts) -> None:
    t = np.array(sorted(ts), dtype=np.int64)
    a_t, both = plots._covered_by_both(*_union(a), *_union(b), t)
    assert both.tolist() == covered_before(*_union(a + b), t).tolist()
    assert a_t.tolist() == covered_before(*_union(a), t).tolist()


def _lanes_by_definition(trace: Trace) -> list[dict[str, list[float]]]:
    """Each lane from its own union of the timed ops of its classes (the old way)."""
    ops = trace.gpu_ops.filter(pl.col("start_ns") > 0)
    cls = pl.col("op_class").replace_strict(OVERLAP_CLASS_OF_OP_CLASS, default="compute")
    ops = ops.with_columns(cls.alias("_cls"))
    out = []
    for tl in plots.device_timelines(trace, {}):
        mine = ops.filter(pl.col("device_id") == tl.device_id)

        def share(sel: pl.Expr, mine: pl.DataFrame = mine, tl=tl) -> np.ndarray:
            u = intervals.union(mine.filter(sel).select("start_ns", "end_ns"), by=[]).collect()
            return plots._coverage(u["start_ns"].to_numpy(), u["end_ns"].to_numpy(), tl.edges)

        lanes = {c: share(pl.col("_cls") == c) for c in plots.CLASSES
                 if mine.filter((pl.col("_cls") == c) & (pl.col("end_ns") > pl.col("start_ns")))
                 .height}
        if "nccl" in lanes:
            nc = share(pl.col("_cls").is_in(["compute", "nccl"]))
            lanes["exposed nccl"] = np.clip(nc - lanes.get("compute", 0.0), 0, 1)
        lanes["idle"] = 1 - share(pl.lit(True))
        out.append({k: v.tolist() for k, v in lanes.items()})
    return out


def _ops(rows: list[tuple[int, int, int, str | None]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"device_id": pl.Int64, "start_ns": pl.Int64,
                                      "end_ns": pl.Int64, "op_class": pl.String},
                        orient="row")


def test_lanes_match_the_definition_with_other_classes_and_untimed_ops() -> None:
    ops = _ops([(0, 0, 50, "compute"), (0, 10, 400, "nccl"), (0, 100, 200, "compute"),
                (0, 150, 300, None), (0, 350, 500, None), (0, 600, 700, "memset"),
                (0, 650, 650, "memcpy_h2d"),  # zero length: no lane
                (1, 5, 80, "nccl"), (1, 90, 95, "nccl"), (1, 20, 30, "compute")])
    tr = Trace.from_frames("t", {"gpu_ops": ops})
    got = [{k: v.tolist() for k, v in tl.lanes.items()} for tl in plots.device_timelines(tr, {})]
    assert got == _lanes_by_definition(tr)
    assert list(got[0]) == ["compute", "nccl", "memset", "exposed nccl", "idle"]


def test_compute_lane_reuses_the_memoised_compute_union(monkeypatch) -> None:
    """Without ops of another class, the compute lane is the nccl pass's compute union."""
    ops = _ops([(0, 10, 50, "compute"), (0, 40, 90, "nccl"), (0, 100, 120, "compute")])
    tr = Trace.from_frames("t", {"gpu_ops": ops})
    device_blocks.union(tr, ["compute"], timed=True)  # as the nccl pass memoises it
    asked: list[frozenset] = []
    real = device_blocks.blocks

    def spy(trace, op_classes=None, timed=True, keep=True):
        asked.append(frozenset(op_classes) if op_classes is not None else frozenset({"*"}))
        return real(trace, op_classes, timed, keep)

    monkeypatch.setattr(device_blocks, "blocks", spy)
    got = [{k: v.tolist() for k, v in tl.lanes.items()} for tl in plots.device_timelines(tr, {})]
    monkeypatch.undo()
    assert got == _lanes_by_definition(tr)
    # compute alone (the memoised union), nccl, busy: no absent class, no compute ∪ nccl
    assert asked == [frozenset({"compute"}), frozenset({"nccl"}), frozenset({"*"})]


def test_lanes_match_the_definition_on_scenarios() -> None:
    for name in ("healthy", "pageable_copies", "unoverlapped_h2d", "starved_input"):
        tr, _ = scenario(name)
        got = [{k: v.tolist() for k, v in tl.lanes.items()}
               for tl in plots.device_timelines(tr, {})]
        assert got == _lanes_by_definition(tr), name


# ---------------------------------------------------------------------------------------------
def _svg_timeline_by_definition(tl: DeviceTimeline, width: int = 1000) -> str:
    """The SVG timeline as first written: every number formatted where it is printed."""
    lanes = list(tl.lanes)
    top_h, lane_h = 120, 14
    h = top_h + lane_h * len(lanes) + 24
    t0, t1 = int(tl.edges[0]), int(tl.edges[-1])
    scale = width / max(t1 - t0, 1)
    bw = width / (tl.edges.size - 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 90}" height="{h}" '
           f'class="tl"><g transform="translate(90,0)">']
    # Each share is formatted once (the tooltips of the busy bars and of the lane cells repeat
    # them), from plain floats: numpy scalars cost more per operation.
    shares = {n: tl.lanes[n].tolist() for n in lanes}
    texts = {n: [fmt_frac(v) for v in shares[n]] for n in lanes}
    secs = (tl.edges / 1e9).tolist()
    busy = tl.busy.tolist()
    n_bins = tl.edges.size - 1
    tips = ([", ".join(parts) for parts in zip(*([f"{n} {t}" for t in texts[n]] for n in lanes),
                                                strict=True)]
            if lanes else [""] * n_bins)
    for i in range(n_bins):  # one rect per bin (bounded by n_bins), not per event
        bh = top_h * busy[i]
        out.append(f'<rect x="{i * bw:.2f}" y="{top_h - bh:.2f}" width="{bw + 0.3:.2f}" '
                   f'height="{bh:.2f}" fill="{plots._COLORS["compute"]}" fill-opacity="0.55">'
                   f'<title>{secs[i]:.6f} s: busy {fmt_frac(busy[i])}; '
                   f'{html.escape(tips[i])}</title></rect>')
    for s, e, d, cause, detail in tl.gaps.iter_rows():
        x = (s - t0) * scale
        out.append(f'<rect x="{x:.2f}" y="0" width="{max((e - s) * scale, 1):.2f}" '
                   f'height="{top_h}" fill="#e53935" fill-opacity="0.3"><title>gap '
                   f'{s / 1e9:.6f} s, {fmt_ns(d)}: {html.escape(str(cause))} '
                   f'{html.escape(str(detail or ""))}</title></rect>')
    for j, n in enumerate(lanes):
        y = top_h + 4 + j * lane_h
        out.append(f'<text x="-4" y="{y + 10}" text-anchor="end" font-size="10">'
                   f'{html.escape(n)}</text>')
        color = plots._COLORS.get(n, "#555")
        for i, (v, text) in enumerate(zip(shares[n], texts[n], strict=True)):
            if v > 0.005:
                out.append(f'<rect x="{i * bw:.2f}" y="{y}" width="{bw + 0.3:.2f}" '
                           f'height="{lane_h - 2}" fill="{color}" fill-opacity="{min(v, 1):.2f}">'
                           f'<title>{n}: {text} of {secs[i]:.6f} s bin</title></rect>')
    out.append(f'<text x="0" y="{h - 4}" font-size="10">{t0 / 1e9:.3f} s</text>'
               f'<text x="{width}" y="{h - 4}" font-size="10" text-anchor="end">'
               f'{t1 / 1e9:.3f} s</text></g></svg>')
    return "".join(out)


def _timeline(lanes: dict[str, list[float]], busy: list[float],
              gaps: pl.DataFrame | None = None) -> DeviceTimeline:
    n = len(busy)
    edges = np.linspace(1_000_000, 9_000_000, n + 1).round().astype(np.int64)
    g = gaps if gaps is not None else pl.DataFrame(
        schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64,
                "cause": pl.String, "cause_detail": pl.String})
    return DeviceTimeline(0, edges, np.array(busy, dtype=float),
                          {k: np.array(v, dtype=float) for k, v in lanes.items()}, g)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, 0.5, 0.004, 0.0051, 1e-5, 0.333333,
                                 float("nan"), 1.2]), min_size=1, max_size=40),
       st.integers(0, 3))
def test_svg_timeline_is_the_definition(values: list[float], n_lanes: int) -> None:
    names = ["compute", "nccl", "exposed nccl", "odd <&> lane"][:n_lanes]
    lanes = {nm: values[k:] + values[:k] for k, nm in enumerate(names)}
    tl = _timeline(lanes, values[::-1])
    assert plots._svg_timeline(tl) == _svg_timeline_by_definition(tl)


def test_svg_timeline_is_the_definition_on_a_scenario() -> None:
    tr, res = scenario("starved_input")
    gaps = res["gaps"].tables["gaps"] if "gaps" in res else None
    tls = plots.device_timelines(tr, {"gaps": gaps} if gaps is not None else {})
    assert tls
    for tl in tls:
        assert plots._svg_timeline(tl) == _svg_timeline_by_definition(tl)
    assert plots._fracs(np.array([0.0, -0.0, 0.0])) == ["0.0%", "-0.0%", "0.0%"]


@pytest.mark.parametrize("name", ["exposed_allreduce", "starved_input"])
def test_binned_timelines_are_each_binning(name: str) -> None:
    """`binned_timelines` (the pictures' bins and report.html's, from one set of unions) gives
    what `device_timelines` gives at each bin count."""
    tr, res = scenario(name)
    tables = {n: df for r in res.values() for n, df in r.tables.items()}
    both = plots.binned_timelines(tr, tables, (1, 2), (600, 2000, 7))
    for got, n_bins in zip(both, (600, 2000, 7), strict=True):
        want = plots.device_timelines(tr, tables, (1, 2), n_bins=n_bins)
        assert [t.device_id for t in got] == [t.device_id for t in want] != []
        for a, b in zip(got, want, strict=True):
            assert a.edges.tolist() == b.edges.tolist() and a.busy.tolist() == b.busy.tolist()
            assert {k: v.tolist() for k, v in a.lanes.items()} == \
                {k: v.tolist() for k, v in b.lanes.items()}
            assert a.gaps.equals(b.gaps) and a.steps == b.steps and a.window == b.window
    assert plots.binned_timelines(Trace.from_frames("t", {}), {}, None, (600, 2000)) == [[], []]
