"""bench/pass_memory.py, the per-pass memory profile RESULTS.md quotes: it runs a pass after
its dependencies and names the lines of the pass where the RSS was highest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_it_profiles_a_pass_after_its_dependencies(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pass_memory.py"),
         str(ROOT / "fixtures" / "example_ddp.sqlite"), "overlap", "--top", "3",
         "--interval-ms", "0.5", "--cache", str(tmp_path / "cache")],
        capture_output=True, text=True, check=True, cwd=tmp_path, timeout=300,
    ).stdout.splitlines()
    assert out[0].startswith("overlap: ") and "peak" in out[0]
    assert 1 <= len(out) - 1 <= 3
    assert all(line.split()[1] == "MB" for line in out[1:])
