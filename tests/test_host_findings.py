"""Host findings: each planted host scenario gets its finding and none of the other host
findings; shared traces get no host warnings; without host evidence the rules say how to
record it; without the host pass nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import NO_SHARED, SHARED_TRACES, shared_sqlite_files

from nsysan import api
from nsysan.findings.rules_host import HOST_CODES
from nsysan.testing import host_scenarios as hs
from nsysan.testing.scenarios import build

PASSES = ["steps", "gaps", "overlap", "attribution", "kernels", "nccl", "host"]


def _diagnose(path: Path | str, passes=PASSES):
    return api.analyze(path, passes=passes).diagnosis


@pytest.mark.parametrize("name", sorted(hs.SCENARIOS))
def test_each_scenario_gets_its_finding_only(tmp_path: Path, name: str) -> None:
    path, truth = hs.SCENARIOS[name](tmp_path / f"{name}.sqlite")
    d = _diagnose(path)
    host = {f.code: f for f in d.findings if f.code in HOST_CODES}
    assert set(host) == {truth["finding"]}, [(f.code, f.message) for f in d.findings]
    f = host[truth["finding"]]
    assert f.message and f.evidence["metrics"]
    others = set(HOST_CODES) - {truth["finding"]}
    assert others <= set(d.not_found) | set(d.unavailable)


def test_cpu_bound_message_names_the_layers(tmp_path: Path) -> None:
    path, truth = hs.cpu_bound_input(tmp_path / "t.sqlite")
    f = next(f for f in _diagnose(path).findings if f.code == "HOST_CPU_BOUND")
    assert "data pipeline 80.0%" in f.message and "framework / Python 20.0%" in f.message
    idle = next(m["value"] for m in f.evidence["metrics"] if m["name"] == "cpu_bound_idle_ns")
    assert idle == truth["gap_idle_ns"]


def test_contention_says_which_rule(tmp_path: Path) -> None:
    path, _ = hs.descheduled_launcher(tmp_path / "t.sqlite")
    f = next(f for f in _diagnose(path).findings if f.code == "CPU_CONTENTION")
    assert "no OS-runtime or CUDA synchronization call explains" in f.message


def test_without_host_evidence_rules_say_how_to_record(tmp_path: Path) -> None:
    path, _ = build("healthy", tmp_path)
    d = _diagnose(path)
    for code in HOST_CODES:
        assert code in d.unavailable
        assert "--sample=cpu --cpuctxsw=process-tree" in d.reasons[code]


def test_without_the_host_pass_diagnosis_is_unchanged(tmp_path: Path) -> None:
    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    d = _diagnose(path, passes=[p for p in PASSES if p != "host"])
    for code in HOST_CODES:
        assert code not in d.unavailable and code not in d.not_found
        assert all(f.code != code for f in d.findings)


@pytest.mark.parametrize("name", shared_sqlite_files())
def test_shared_traces_get_no_host_warnings(shared_traces: Path, name: str) -> None:
    if name == NO_SHARED:
        pytest.skip("no shared traces")
    d = _diagnose(SHARED_TRACES / name)
    warned = [(f.code, f.message) for f in d.findings
              if f.code in HOST_CODES and f.severity != "info"]
    assert not warned
    if "sc23-vit" in name:  # the ViT run waits in the driver: GPU-bound
        assert any(f.code == "HOST_WAITS_ON_GPU" for f in d.findings)


def test_verdict_takes_host_evidence_into_account(tmp_path: Path) -> None:
    path, _ = hs.gpu_bound_driver_wait(tmp_path / "t.sqlite")
    with_host = _diagnose(path).verdict
    without = _diagnose(path, passes=[p for p in PASSES if p != "host"]).verdict
    assert with_host.label == without.label == "compute-bound"
    assert "GPU-bound and CPU-side tuning will not help" in with_host.reason
    assert "host evidence" not in without.reason


def test_findings_md_gains_a_host_section(tmp_path: Path) -> None:
    from nsysan.report.markdown import render_markdown

    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    result = api.analyze(path, passes=PASSES)
    host = result.results["host"].tables
    md = render_markdown(result.diagnosis, result.trace, host=host)
    assert "## Host threads (CPU sampling)" in md
    assert "| python (tid 4242) |" in md and "data_pipeline 80.0%" in md
    plain = render_markdown(result.diagnosis, result.trace)
    assert "## Host threads" not in plain


def test_host_is_a_default_pass(tmp_path: Path) -> None:
    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    assert any(f.code == "HOST_CPU_BOUND" for f in _diagnose(path, passes=None).findings)


def test_timeline_gains_a_host_lane_per_launching_thread(tmp_path: Path) -> None:
    import numpy as np

    from nsysan.report import plots

    path, _ = hs.descheduled_launcher(tmp_path / "t.sqlite")
    result = api.analyze(path)
    (tl,) = plots.device_timelines(result.trace, result.tables)
    lane = tl.lanes["host 4242 fw"]
    # brute force: on-CPU share of every bin from the planted intervals
    on = [(t, t + 300 * hs.US) for t in (hs.MS + i * 8_300 * hs.US for i in range(12))]
    want = [sum(max(0, min(e, b1) - max(s, b0)) for s, e in on) / max(b1 - b0, 1)
            for b0, b1 in zip(tl.edges[:-1].tolist(), tl.edges[1:].tolist(), strict=True)]
    assert np.allclose(lane, want)
    assert not any(k.startswith("host") for k in plots.device_timelines(result.trace, {})[0].lanes)


def test_host_lane_bins_take_the_layer_of_most_samples(tmp_path: Path) -> None:
    """Brute force over the raw COMPOSITE_EVENTS/SAMPLING_CALLCHAINS rows: the leaf module
    (a libc leaf counts in its caller's), layer by module, most samples per bin, ties in
    `HOST_LAYERS` order; bins without a sample are -1."""
    import sqlite3
    from collections import Counter

    from nsysan.frames.host_taxonomy import HOST_LAYERS
    from nsysan.report import plots

    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    result = api.analyze(path)
    (tl,) = plots.device_timelines(result.trace, result.tables, n_bins=97)
    got = tl.host_layers["host 4242 data"]
    layer_of = {hs.DALI: "data_pipeline", hs.JPEG: "data_pipeline", hs.PYTHON: "framework"}
    with sqlite3.connect(path) as db:
        names = dict(db.execute("SELECT id, value FROM StringIds"))
        stacks: dict[int, list[str]] = {}
        for sid, module, _depth in db.execute(
                "SELECT id, module, stackDepth FROM SAMPLING_CALLCHAINS ORDER BY id, stackDepth"):
            stacks.setdefault(sid, []).append(names[module])
        times = dict(db.execute("SELECT id, start FROM COMPOSITE_EVENTS"))
    edges = tl.edges.tolist()
    per_bin: list[Counter[str]] = [Counter() for _ in range(len(edges) - 1)]
    for sid, t in times.items():
        module = next(m for m in stacks[sid] if m != hs.LIBC)
        inside = [i for i in range(len(edges) - 1)  # (the bins span the device's ops)
                  if edges[i] <= t < edges[i + 1] or (i == len(edges) - 2 and t == edges[-1])]
        for k in inside:
            per_bin[k][layer_of[module]] += 1
    want = [-1 if not c else min(HOST_LAYERS.index(x) for x in c
                                 if c[x] == max(c.values())) for c in per_bin]
    assert got.tolist() == want and -1 in want
    assert {HOST_LAYERS[i] for i in set(want) - {-1}} == {"data_pipeline", "framework"}


def test_timeline_png_colours_host_lanes_by_layer(tmp_path: Path) -> None:
    import io

    import numpy as np
    from PIL import Image

    from nsysan.frames.host_taxonomy import HOST_LAYERS
    from nsysan.report import plots

    # one colour per host layer, in its order, then the one of bins without a sample
    assert len(plots._HOST_LAYER_COLORS) == len(HOST_LAYERS) + 1
    assert [k.replace(" ", "_") for k in plots._HOST_LAYER_COLORS][:4] == list(HOST_LAYERS[:4])
    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    result = api.analyze(path)
    (tl,) = plots.device_timelines(result.trace, result.tables)
    png = plots.timeline_png(tl, tmp_path / "t.png")
    img = np.asarray(Image.open(io.BytesIO(png.read_bytes())).convert("RGB"))
    orange = np.array([0xEF, 0x6C, 0x00])  # data pipeline, at full on-CPU share
    assert (np.abs(img.astype(int) - orange).sum(axis=2) == 0).sum() > 1000
    plain = plots.DeviceTimeline(tl.device_id, tl.edges, tl.busy, tl.lanes, tl.gaps)
    without = np.asarray(Image.open(plots.timeline_png(plain, tmp_path / "p.png")))
    assert img.shape[0] == without.shape[0] + 18  # the layers' legend row
    assert (np.abs(without[..., :3].astype(int) - orange).sum(axis=2) == 0).sum() < 1000


def test_analyze_to_dir_frees_the_host_frames_and_draws_the_same_lanes(tmp_path: Path) -> None:
    """`nsysan analyze` releases ``sched`` and ``cpu_samples`` once the host pass is done (it
    is their last reader); the timeline's host lanes come from what the pass shared, and
    equal those built from the frames again (`bench/golden.py` checks the pictures byte for
    byte)."""
    from nsysan.load import open_trace
    from nsysan.passes import host
    from nsysan.report import plots

    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    trace = open_trace(path, frame_cache=False)
    result, out = api.analyze_to_dir(trace, tmp_path / "out")
    assert {"sched", "cpu_samples"}.isdisjoint(trace._frames)
    assert "gpu_ops" in trace._frames  # what the findings and pictures read stays
    drawn = host.lane_threads(result.tables["host_threads"])
    assert drawn.height >= 1
    # built again from the frames (a plain trace keeps no product): the same lanes
    again = host.lanes(result.trace, drawn)
    assert {"sched", "cpu_samples"} <= set(trace._frames)
    with api.analysis_context(trace) as ctx:
        host.run(ctx, host.HostParams(), {"gaps": result.results["gaps"]})
        assert "host.lanes" in ctx.products()  # shared by the pass, not built by the call
        shared = host.lanes(ctx, drawn)
    for a, b in zip(shared, again, strict=True):
        assert a.equals(b) and a.height > 0
    (tl,) = plots.device_timelines(result.trace, result.tables)
    assert any(k.startswith("host ") for k in tl.lanes)
    assert (out / "timeline_device0.png").is_file()


def test_library_analyze_keeps_every_frame(tmp_path: Path) -> None:
    """`api.analyze` (notebooks) releases nothing: the caller may read any frame after."""
    from nsysan.load import open_trace

    path, _ = hs.cpu_bound_input(tmp_path / "t.sqlite")
    trace = open_trace(path, frame_cache=False)
    api.analyze(trace)
    assert {"sched", "cpu_samples"} <= set(trace._frames)
