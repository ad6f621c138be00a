"""Fault suite: ``kill -9`` at random moments of ``nsysan analyze`` and ``nsysan batch``.

After every kill an output folder under its final name is either absent or complete (its
marker in final form, every file it and the manifest list present with the manifest's sha256);
the next run succeeds and leaves no temporary folder or file behind (docs/outputs.md,
"Temporary folders, interrupted runs").
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from outputs_helpers import EXAMPLE, LAYERS, PACKAGE_ROOT, nsysan, temp_entries

pytestmark = pytest.mark.slow

#: the seed of the kill moments: the same moments on every run of the suite
SEED = 16


def _start(*args: str | os.PathLike[str]) -> subprocess.Popen[bytes]:
    # its own session: the kill reaches the batch's worker processes too, as a CI job's would
    return subprocess.Popen([sys.executable, "-m", "nsysan", *map(os.fspath, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)})


def _kill_after(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """SIGKILL the process group of ``proc`` after ``seconds`` (True when it was still
    running then)."""
    try:
        proc.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def _duration(*args: str | os.PathLike[str]) -> float:
    """Seconds an uninterrupted run takes here (the quicker of two: the first may compile
    bytecode): the kills are spread over it, however fast or loaded this machine is."""
    times = []
    for _ in range(2):
        t = time.perf_counter()
        assert _start(*args).wait() == 0
        times.append(time.perf_counter() - t)
    return min(times)


def _moments(n: int, total: float) -> list[float]:
    """``n`` kill moments over a run of ``total`` seconds, from start-up to the last write."""
    rng = random.Random(SEED)
    return [total * (0.1 + 0.9 * (i + rng.random()) / n) for i in range(n)]


def assert_complete(folder: Path) -> None:
    """``folder`` is a finished analysis: final marker, every listed file there, hashes right."""
    marker = json.loads((folder / ".nsysan-output.json").read_text(encoding="utf-8"))
    assert "state" not in marker and marker["kind"] == "analysis", marker
    listed = set(marker["files"])
    present = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    assert present == listed, (folder, present ^ listed)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    for out in manifest["outputs"]:
        digest = hashlib.sha256((folder / out["path"]).read_bytes()).hexdigest()
        assert digest == out["sha256"], (folder, out["path"])
    assert {o["path"] for o in manifest["outputs"]} | {"manifest.json"} == listed


def assert_no_partial(out: Path) -> None:
    if not out.is_dir():
        return
    for folder in out.iterdir():
        if folder.is_dir() and not folder.name.startswith("."):
            assert_complete(folder)


def test_kill_during_analyze(tmp_path: Path) -> None:
    out = tmp_path / "out"
    total = _duration("analyze", EXAMPLE, LAYERS, "-o", tmp_path / "timed")
    killed = 0
    for delay in _moments(8, total):
        killed += _kill_after(_start("analyze", EXAMPLE, LAYERS, "-o", out), delay)
        assert_no_partial(out)
    assert killed >= 3, "the kills came too late to test anything"
    done = nsysan("analyze", EXAMPLE, LAYERS, "-o", out)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(out)) == ["example_ddp", "example_layers"]
    assert_no_partial(out)
    assert temp_entries(out) == []


def test_kill_during_batch(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, src in (("a", EXAMPLE), ("b", LAYERS), ("c", EXAMPLE)):
        shutil.copy(src, inputs / f"{name}.sqlite")
    out = tmp_path / "out"
    args = ("--jobs", "2", "--progress", "none")
    total = _duration("batch", inputs, "-o", tmp_path / "timed", *args)
    killed = 0
    for i, delay in enumerate(_moments(5, total)):
        # another parameter each time: every trace is analysed again (not skipped), and the
        # folders finished by an earlier run are being replaced when the kill comes
        again = ("--set", f"gaps.min_gap_ns={100_000 + i}")
        killed += _kill_after(_start("batch", inputs, "-o", out, *args, *again), delay)
        assert_no_partial(out)
        for folder in out.glob("*.sqlite"):  # a done marker only beside finished outputs
            assert_complete(folder)
    assert killed >= 2, "the kills came too late to test anything"
    time.sleep(0.2)  # the workers die with their coordinator (PR_SET_PDEATHSIG)
    done = nsysan("batch", inputs, "-o", out, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed" in done.stdout
    assert sorted(p for p in os.listdir(out) if p.endswith(".sqlite")) == [
        "a.sqlite", "b.sqlite", "c.sqlite"]
    assert_no_partial(out)
    assert temp_entries(out) == []
