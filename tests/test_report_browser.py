"""report.html in a real browser: headless Chromium driven by Selenium (Debian's chromium and
chromium-driver, see .ci/install-system.sh).

Each page must load without a console error or a network request, draw every device's lanes,
zoom to each finding's evidence window when it is clicked (the visible range then contains the
window, which is highlighted), and sort its tables. Missing Chromium, chromedriver or Selenium
skips locally and fails under CI=true (`conftest.unavailable`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT, unavailable

from nsysan.api import analyze_to_dir

EXAMPLE = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
SHARED_2GPU = "nsysai-h100-2gpu/mfu_2gpu_before.sqlite"
CHROMIUM = os.environ.get("NSYSAN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = (os.environ.get("NSYSAN_CHROMEDRIVER") or shutil.which("chromedriver")
                or "/usr/bin/chromedriver")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium is not installed (pip install -e '.[test]')")
    for path, what in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromedriver")):
        if not (Path(path).is_file() and os.access(path, os.X_OK)):
            unavailable(f"{what} not found at {path} (.ci/install-system.sh installs it)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,900", "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def _open(driver, page: Path) -> dict:
    driver.get(page.resolve().as_uri())
    ok = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.nsysanReport.ready.then(() => done('ok'), e => done(String(e)));")
    assert ok == "ok"
    return driver.execute_script("return window.nsysanReport.state()")


def _console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def _check_page(driver, page: Path, shots: Path) -> dict:
    driver.get_log("browser")  # (drop what an earlier page logged)
    state = _open(driver, page)
    assert _console_errors(driver) == []
    assert state["errors"] == []
    # offline: no resource was fetched (the page is one file)
    assert driver.execute_script(
        "return performance.getEntriesByType('resource').length") == 0
    doc = json.loads((page.parent / "findings.json").read_text(encoding="utf-8"))
    devices = sorted({w["device_id"] for f in doc["findings"] for w in f["evidence"]["windows"]
                      if w["device_id"] is not None})
    drawn = {d["id"]: d for d in state["devices"]}
    assert set(devices) <= set(drawn)
    assert drawn, "no device timeline"
    for dev in drawn.values():  # every device draws, and each of its stream lanes
        assert dev["rects"] > 0, dev
        lanes = [r for r in dev["rows"] if r["type"] == "lane"]
        assert len(lanes) == dev["lanes"] > 0
        assert all(r["rects"] > 0 for r in lanes), lanes
    assert driver.execute_script("return document.body.dataset.drawn") == str(
        len(driver.find_elements("css selector", "#tl-root canvas")))
    assert driver.execute_script("return document.body.dataset.ops") == "ready"
    _check_windows(driver, doc)
    _check_sorting(driver)
    shot = shots / f"{page.parent.name}.png"
    driver.execute_script("window.scrollTo(0, 0)")
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _console_errors(driver) == []
    return state


def _check_windows(driver, doc: dict) -> None:
    windows = [w for f in doc["findings"] for w in f["evidence"]["windows"]]
    buttons = driver.find_elements("css selector", "button.win")
    assert len(buttons) == len(windows)  # every evidence window of every finding is listed
    for button, w in zip(buttons, windows, strict=True):
        driver.execute_script("arguments[0].click()", button)
        state = driver.execute_script("return window.nsysanReport.state()")
        v0, v1 = state["view"]
        assert v0 <= w["start_ns"] and w["end_ns"] <= v1, (state["view"], w)
        # zoomed: the window takes a good part of the view, not a speck of the whole trace
        assert (v1 - v0) <= 2 * max(w["end_ns"] - w["start_ns"], 1000) + 1000
        assert state["highlight"]["t0"] == w["start_ns"]
        assert state["highlight"]["t1"] == w["end_ns"]
        assert state["highlight"]["device"] == w["device_id"]
        # the device of the window draws something there
        for dev in state["devices"]:
            if w["device_id"] in (None, dev["id"]):
                assert dev["rects"] > 0
    driver.find_element("id", "tl-reset").click()


def _column(driver, table: str, col: int, kind: str) -> list[str]:
    """The cells of one column, top to bottom: their text, or their sort value (numbers)."""
    what = "textContent" if kind == "text" else "dataset.v"
    return driver.execute_script(
        f"return Array.from(document.querySelectorAll('table[data-table={table}] tbody tr'))"
        f".map(r => r.cells[{col}].{what})")


def _check_sorting(driver) -> None:
    tables = driver.find_elements("css selector", "table.sortable")
    assert tables
    for table in tables:
        name = table.get_attribute("data-table")
        heads = table.find_elements("css selector", "th")
        for col, th in enumerate(heads):
            kind = th.get_attribute("data-kind")
            before = _column(driver, name, col, kind)
            driver.execute_script("arguments[0].click()", th)
            asc = _column(driver, name, col, kind)
            driver.execute_script("arguments[0].click()", th)
            desc = _column(driver, name, col, kind)
            assert sorted(asc) == sorted(before)  # the same rows, reordered
            if kind == "text":
                assert asc == sorted(asc) and desc == sorted(desc, reverse=True)
            else:
                nums = [float(x) for x in asc if x != ""]
                assert nums == sorted(nums)
                nums = [float(x) for x in desc if x != ""]
                assert nums == sorted(nums, reverse=True)


def test_example_report_in_chromium(browser, tmp_path: Path) -> None:
    _, out = analyze_to_dir(EXAMPLE, tmp_path / "out")
    state = _check_page(browser, out / "report.html", tmp_path)
    assert state["nvtxRects"] > 0  # the launching thread's NVTX lane draws
    assert state["opsLoaded"] == 636  # every GPU op of the example (636 in its gpu_ops)
    # the README's picture: the first finding's first window, clicked
    browser.execute_script("document.querySelector('button.win').click();"
                           "window.scrollTo(0, 0)")
    shot = tmp_path / "finding_window.png"
    assert browser.save_screenshot(str(shot))
    small = _small_png(shot)
    assert small.stat().st_size < 150_000
    target = os.environ.get("NSYSAN_SAVE_SCREENSHOT")  # docs/img/report.png is made so
    if target:
        shutil.copyfile(small, target)


def _small_png(path: Path) -> Path:
    """The screenshot cropped to the verdict and the timeline, in 128 colours."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB").crop((0, 0, im.width, min(im.height, 620)))
        small = im.quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    out = path.with_name(path.stem + "_small.png")
    small.save(out, optimize=True)
    return out


def test_shared_two_gpu_report_in_chromium(browser, shared_traces: Path, tmp_path: Path) -> None:
    src = shared_traces / SHARED_2GPU
    if not src.is_file():
        unavailable(f"{src} not found")
    _, out = analyze_to_dir(src, tmp_path / "out")
    state = _check_page(browser, out / "report.html", tmp_path)
    assert len(state["devices"]) == 2


def test_zoomed_in_draws_every_op(browser, tmp_path: Path) -> None:
    """Zoomed in past the overview bins, a lane draws its ops themselves: the count drawn
    equals the ops of that lane in view, counted here from gpu_ops."""
    import numpy as np
    import polars as pl

    from nsysan.load import open_trace

    _, out = analyze_to_dir(EXAMPLE, tmp_path / "out")
    _open(browser, out / "report.html")
    ops = open_trace(EXAMPLE).gpu_ops.filter(pl.col("start_ns") > 0)
    t0 = int(ops["start_ns"].min())
    a, b = t0 + 20_000_000, t0 + 23_000_000  # 3 ms of a busy step
    state = browser.execute_script(f"window.nsysanReport.setView({a}, {b});"
                                   "return window.nsysanReport.state()")
    dev = state["devices"][0]
    assert dev["mode"] == "detail"
    a, b = state["view"]
    lanes = [r for r in dev["rows"] if r["type"] == "lane"]
    streams = ops.select("stream_id").unique().sort("stream_id")["stream_id"].to_list()
    scale = (dev["width"] - dev["left"]) / (b - a)
    total = 0
    for lane, stream in zip(lanes, streams, strict=True):
        in_view = ops.filter((pl.col("stream_id") == stream) & (pl.col("end_ns") >= a)
                             & (pl.col("start_ns") <= b))
        # an op of >= 1 px is a rect of its own; narrower ones share one column per pixel
        s = (in_view["start_ns"].to_numpy() - a) * scale
        e = (in_view["end_ns"].to_numpy() - a) * scale
        wide = int(((e - s) >= 1).sum())
        columns = {int(x) for x in np.floor(dev["left"] + s[(e - s) < 1])
                   if dev["left"] <= x < math.ceil(dev["width"]) + 1}
        assert lane["rects"] == wide + len(columns), (stream, lane, wide, len(columns))
        total += in_view.height
    assert total > 0


def test_tooltip_names_the_op_and_its_launch(browser, tmp_path: Path) -> None:
    """Hovering an op, zoomed in, shows its name, duration, stream and launch call, as the
    trace has them (the launch call joined here on (global_pid, correlation_id))."""
    import polars as pl

    from nsysan.load import open_trace

    _, out = analyze_to_dir(EXAMPLE, tmp_path / "out")
    _open(browser, out / "report.html")
    tr = open_trace(EXAMPLE)
    ops = tr.gpu_ops.filter(pl.col("start_ns") > 0, pl.col("kind") == "kernel").join(
        tr.cuda_api.select("global_pid", "correlation_id", pl.col("name").alias("api")),
        on=["global_pid", "correlation_id"], how="left")
    op = ops.sort(["start_ns", "stream_id"]).row(ops.height // 2, named=True)
    dur = op["end_ns"] - op["start_ns"]
    a, b = op["start_ns"] - 3 * dur, op["end_ns"] + 3 * dur
    state = browser.execute_script(f"window.nsysanReport.setView({a}, {b});"
                                   "return window.nsysanReport.state()")
    dev = state["devices"][0]
    lanes = [r for r in dev["rows"] if r["type"] == "lane"]
    lane = next(r for r in lanes if r["label"] == f"stream {op['stream_id']}")
    v0, v1 = state["view"]
    x = dev["left"] + ((op["start_ns"] + op["end_ns"]) / 2 - v0) * (
        dev["width"] - dev["left"]) / (v1 - v0)
    text = browser.execute_script(
        "const c = document.querySelector('#tl-root canvas[data-kind=device]');"
        "const r = c.getBoundingClientRect();"
        f"c.dispatchEvent(new MouseEvent('mousemove', {{clientX: r.left + c.clientLeft + {x},"
        f" clientY: r.top + {lane['y'] + lane['h'] / 2}, bubbles: true}}));"
        "return document.getElementById('tl-tip').textContent")
    assert text.splitlines()[0] == op["name"]
    assert f"stream {op['stream_id']}" in text
    assert f"launched by {op['api']}" in text
    value, unit = text.splitlines()[1].split(" at ")[0].split()
    scale = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}[unit]
    assert float(value) * scale == pytest.approx(dur, rel=1e-3)


def test_wheel_zooms_around_the_pointer_and_drag_pans(browser, tmp_path: Path) -> None:
    _, out = analyze_to_dir(EXAMPLE, tmp_path / "out")
    whole = _open(browser, out / "report.html")["view"]
    dev = browser.execute_script("return window.nsysanReport.state()")["devices"][0]
    frac = 0.25  # the pointer a quarter into the plot
    x = dev["left"] + frac * (dev["width"] - dev["left"])
    script = ("const c = document.querySelector('#tl-root canvas[data-kind=device]');"
              "const r = c.getBoundingClientRect(); const bx = c.clientLeft;"
              "const ev = (type, x, extra) => c.dispatchEvent(new (type === 'wheel' ? WheelEvent"
              " : MouseEvent)(type, Object.assign({clientX: r.left + bx + x, clientY: r.top + 40,"
              " bubbles: true, cancelable: true}, extra || {})));")
    t = whole[0] + frac * (whole[1] - whole[0])
    zoomed = browser.execute_script(
        script + f"ev('wheel', {x}, {{deltaY: -400}});"
        "return window.nsysanReport.state().view")
    assert zoomed[1] - zoomed[0] < 0.7 * (whole[1] - whole[0])  # zoomed in
    # the instant under the pointer stays under it (to the pixel: events round clientX)
    pixel = (whole[1] - whole[0]) / (dev["width"] - dev["left"])
    assert zoomed[0] + frac * (zoomed[1] - zoomed[0]) == pytest.approx(t, abs=pixel)
    dragged = browser.execute_script(
        script + f"ev('mousedown', {x}); window.dispatchEvent(new MouseEvent('mousemove',"
        f" {{clientX: r.left + bx + {x} + 100, clientY: r.top + 40}}));"
        "window.dispatchEvent(new MouseEvent('mouseup', {}));"
        "return window.nsysanReport.state().view")
    shift = 100 * (zoomed[1] - zoomed[0]) / (dev["width"] - dev["left"])
    # dragged right: earlier times come into view, by the pixels dragged (to the pixel)
    assert dragged[0] == pytest.approx(zoomed[0] - shift, abs=shift / 100)
    assert dragged[1] - dragged[0] == pytest.approx(zoomed[1] - zoomed[0], rel=1e-9)
    reset = browser.execute_script(script + f"ev('dblclick', {x});"
                                   "return window.nsysanReport.state().view")
    assert reset == pytest.approx(whole)
