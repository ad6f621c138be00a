"""The timeline lanes (`plots.device_timelines`) are what the direct definition gives: one
union per overlap class (any other op_class counts as compute), compute ∪ nccl measured from
the compute and nccl blocks equals the union of those ops, and only present classes are cut."""

from __future__ import annotations

import numpy as np
import polars as pl
from findings_cases import scenario
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import intervals
from nsysan.frames.schemas import OVERLAP_CLASS_OF_OP_CLASS
from nsysan.frames.trace import Trace
from nsysan.passes import device_blocks
from nsysan.passes.device_blocks import covered_before
from nsysan.report import plots

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
    want = covered_before(*_union(a + b), t)
    assert plots._covered_by_both(*_union(a), *_union(b), t).tolist() == want.tolist()


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
                (0, 150, 300, "weird"), (0, 350, 500, None), (0, 600, 700, "memset"),
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
