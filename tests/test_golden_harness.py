"""bench/golden.py: the harness that proves a restructuring left every output byte-identical
must itself notice one changed byte, and only volatile manifest fields may be ignored."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "golden.py"


@pytest.fixture(scope="module")
def golden():
    spec = importlib.util.spec_from_file_location("nsysan_bench_golden", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path, table: bytes, created: str, steps_s: float, rows: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "t.parquet").write_bytes(table)
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "a.png").write_bytes(b"\x89PNG")
    (root / "manifest.json").write_text(json.dumps({
        "created_utc": created, "command": ["x", created], "timings_s": {"steps": steps_s},
        "raw_tables": {"K": rows}}))


def test_a_changed_byte_is_found(golden, tmp_path):
    _tree(tmp_path / "a", b"abc", "2026-01-01", 0.1, 5)
    _tree(tmp_path / "b", b"abd", "2026-01-01", 0.1, 5)
    want = {"case": golden.hash_tree(tmp_path / "a")}
    got = {"case": golden.hash_tree(tmp_path / "b")}
    assert golden.differences(want, got) == ["case: t.parquet differs"]
    assert golden.differences(want, want) == []


def test_volatile_manifest_fields_are_ignored_and_others_not(golden, tmp_path):
    _tree(tmp_path / "a", b"abc", "2026-01-01", 0.1, 5)
    _tree(tmp_path / "b", b"abc", "2027-02-02", 9.9, 5)
    _tree(tmp_path / "c", b"abc", "2026-01-01", 0.1, 6)
    a, b, c = (golden.hash_tree(tmp_path / n) for n in "abc")
    assert a == b
    assert golden.differences({"x": a}, {"x": c}) == ["x: manifest.json differs"]


def test_missing_new_files_and_cases(golden):
    want = {"one": {"f": "1", "g": "2"}, "two": {}}
    got = {"one": {"f": "1", "h": "3"}, "three": {}}
    assert golden.differences(want, got) == [
        "one: g missing", "one: h new", "three: new case", "two: not analysed"]
