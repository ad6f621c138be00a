"""The frame cache's disk space (`nsysan.load.cache_space`, ``nsysan cache list|prune``):
what it lists, what it removes (only nsysan's files, least recently used first, never the
trace in use) and the bound every analysis keeps it to (``$NSYSAN_CACHE_MAX``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO_ROOT
from polars.testing import assert_frame_equal

from nsysan.cli import cli
from nsysan.errors import ConfigError
from nsysan.load import cache, open_trace
from nsysan.load.cache_space import entries, parse_size, prune

DDP = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
LAYERS = REPO_ROOT / "fixtures" / "example_layers.sqlite"
DAY = 86400.0


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    monkeypatch.delenv("NSYSAN_CACHE_MAX", raising=False)


def _cache(trace: Path, cache_dir: Path) -> Path:
    """Cache ``trace``'s gpu_ops and nvtx under ``cache_dir``; its folder."""
    t = open_trace(trace, cache_dir=cache_dir, frame_cache=True)
    t.frame("gpu_ops"), t.frame("nvtx")
    cache.flush()
    return cache.folder_for(trace, cache_dir)


def _aged(folder: Path, days: float) -> None:
    when = time.time() - days * DAY
    os.utime(folder, (when, when))


def _files_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["cache", *args])
    return result.exit_code, result.output


def test_list_names_each_cached_trace_least_recently_used_first(tmp_path: Path) -> None:
    code, out = _run("list", "--cache-dir", str(tmp_path))
    assert code == 0 and out.startswith("0 cached trace(s), 0 B")
    ddp, layers = _cache(DDP, tmp_path), _cache(LAYERS, tmp_path)
    _aged(ddp, 3), _aged(layers, 1)
    found = entries(tmp_path / "frames")
    assert [e.folder for e in found] == [ddp, layers]
    assert [e.bytes for e in found] == [_files_bytes(ddp), _files_bytes(layers)]
    assert found[0].source_name == "example_ddp.sqlite"
    code, out = _run("list", "--cache-dir", str(tmp_path))
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert "example_ddp.sqlite" in lines[0] and "example_layers.sqlite" in lines[1]
    assert lines[2].startswith("2 cached trace(s)") and "bound 20.00 GiB" in lines[2]
    code, out = _run("list", "--cache-dir", str(tmp_path), "--json")
    doc = json.loads(out)
    assert doc["bytes"] == sum(e.bytes for e in found)
    assert [t["source"] for t in doc["traces"]] == ["example_ddp.sqlite", "example_layers.sqlite"]


def test_prune_removes_the_least_recently_used_first(tmp_path: Path) -> None:
    ddp, layers = _cache(DDP, tmp_path), _cache(LAYERS, tmp_path)
    _aged(ddp, 3), _aged(layers, 1)
    code, out = _run("prune", "--cache-dir", str(tmp_path), "--max-size",
                     str(_files_bytes(layers)), "--dry-run")
    assert code == 0 and "would remove 1 trace(s)" in out and ddp.is_dir()
    code, out = _run("prune", "--cache-dir", str(tmp_path), "--max-size",
                     str(_files_bytes(layers)))
    assert code == 0 and "removed 1 trace(s)" in out and "example_ddp.sqlite" in out
    assert not ddp.exists() and layers.is_dir()
    # used again: served from the cache, its folder marked as used now
    before = layers.stat().st_mtime
    _cache(LAYERS, tmp_path)
    assert layers.stat().st_mtime > before


def test_prune_by_age_and_all(tmp_path: Path) -> None:
    ddp, layers = _cache(DDP, tmp_path), _cache(LAYERS, tmp_path)
    _aged(ddp, 10), _aged(layers, 2)
    assert [e.folder for e in prune(tmp_path / "frames", older_than_s=5 * DAY)] == [ddp]
    assert layers.is_dir()
    code, out = _run("prune", "--cache-dir", str(tmp_path), "--all")
    assert code == 0 and "removed 1 trace(s)" in out and "0 folder(s) left, 0 B" in out
    assert not layers.exists()


def test_prune_removes_only_what_nsysan_wrote(tmp_path: Path) -> None:
    ddp = _cache(DDP, tmp_path)
    root = tmp_path / "frames"
    (root / "README.txt").write_text("mine")  # a file of the user's beside the folders
    (root / "notes.0123456789abcdef01234567").mkdir()  # named like a cache folder, not one
    (root / "notes.0123456789abcdef01234567" / "x.txt").write_text("mine")
    layers = _cache(LAYERS, tmp_path)
    (layers / "keep.txt").write_text("mine")  # a file of the user's inside a cache folder
    young = ddp / f".gpu_ops.{'a' * 32}.tmp"  # a write in progress: never removed
    young.write_bytes(b"x")
    old = ddp / f".nvtx.{'b' * 32}.tmp"  # left by a killed analysis long ago
    old.write_bytes(b"x")
    _aged(old, 2)
    prune(root, everything=True)
    assert sorted(p.name for p in ddp.iterdir()) == [young.name]
    assert [p.name for p in layers.iterdir()] == ["keep.txt"]
    assert (root / "README.txt").read_text() == "mine"
    assert (root / "notes.0123456789abcdef01234567" / "x.txt").read_text() == "mine"


def test_prune_removes_every_file_nsysan_writes_and_only_those(tmp_path: Path) -> None:
    folder = _cache(DDP, tmp_path)
    ours = [f".source.sha256.json.{'c' * 32}.tmp",  # a digest's write, left long ago
            f".source.tables.json.{'d' * 32}.tmp", f".nvtx.{'e' * 32}.tmp",
            "gpu_ops.parquet", "nvtx.parquet"]  # frames of a cache revision before 13
    theirs = ["mydata.arrow", "gpu_ops.arrow\n", "gpu_ops.arrow.bak", f".mine.{'f' * 32}.tmp"]
    for name in ours + theirs:
        (folder / name).write_bytes(b"x")
        _aged(folder / name, 2)
    prune(tmp_path / "frames", everything=True)
    assert sorted(p.name for p in folder.iterdir()) == sorted(theirs)


def test_every_frame_the_loader_builds_has_files_prune_knows() -> None:
    # a new frame must not leave its cached files (and so its folder) behind
    from nsysan.load.adapters import QUALITY_TABLES
    from nsysan.load.cache import FRAME_FILES
    from nsysan.load.cache_space import OWN_FILES

    for frame in QUALITY_TABLES:
        for suffix in FRAME_FILES:
            assert OWN_FILES.fullmatch(frame + suffix), frame + suffix
        assert OWN_FILES.fullmatch(f".{frame}.{'0' * 32}.tmp"), frame


def test_prune_follows_no_link_out_of_the_cache(tmp_path: Path) -> None:
    # a cache folder replaced by a link after it was listed: removal does not follow it
    from nsysan.load import cache_space

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gpu_ops.arrow").write_bytes(b"the user's")
    link = tmp_path / f"x.sqlite.{'0' * 24}"
    link.symlink_to(elsewhere, target_is_directory=True)
    assert cache_space._remove(link, time.time()) == (0, True)  # (nothing removed; it stays)
    assert (elsewhere / "gpu_ops.arrow").read_bytes() == b"the user's"
    dangling = tmp_path / f"y.sqlite.{'0' * 24}"
    dangling.symlink_to(tmp_path / "nowhere", target_is_directory=True)
    assert cache_space._remove(dangling, time.time()) == (0, True)  # (a link still there)


def test_a_frame_in_use_stays_readable_when_its_files_are_pruned(tmp_path: Path) -> None:
    trace = open_trace(DDP, cache_dir=tmp_path, frame_cache=True)
    frame = trace.frame("gpu_ops")  # mapped from the cache's files
    cache.flush()
    prune(tmp_path / "frames", everything=True)
    assert not list((tmp_path / "frames").rglob("*.arrow"))
    assert_frame_equal(frame, open_trace(DDP, frame_cache=False).frame("gpu_ops"))


def test_an_analysis_keeps_the_cache_within_its_bound(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ddp = _cache(DDP, tmp_path)
    _aged(ddp, 1)
    monkeypatch.setenv("NSYSAN_CACHE_MAX", "1")  # one byte: no other trace may stay
    layers = _cache(LAYERS, tmp_path)
    assert not ddp.exists()
    assert layers.is_dir() and _files_bytes(layers) > 1  # the trace in use is never removed
    kept = (layers / "gpu_ops.arrow").stat().st_ino
    _cache(LAYERS, tmp_path)  # opened again over the bound: served from its own files
    assert (layers / "gpu_ops.arrow").stat().st_ino == kept
    monkeypatch.setenv("NSYSAN_CACHE_MAX", "none")
    _cache(DDP, tmp_path)
    assert ddp.is_dir() and layers.is_dir()


@pytest.mark.parametrize("text, value", [
    ("20G", 20 << 30), ("1.5GB", 3 << 29), ("512 MiB", 512 << 20), ("4096", 4096),
    ("none", None), (" 7k ", 7 << 10), ("20GiB", 20 << 30), ("0", 0), ("3B", 3),
    ("123456789012345678901", 123456789012345678901),  # exact, where a float rounds
    ("9" * 40 + "T", int("9" * 40) << 40)])
def test_sizes(text: str, value: int | None) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["20iB", "noneb", "-1", "1e9", "G", "1.5.G", "20 gigs", ""])
def test_not_sizes(text: str) -> None:
    with pytest.raises(ConfigError, match="not a size"):
        parse_size(text)


def test_bad_bounds_are_one_line_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for args, what in ((["--max-size", "lots"], "--max-size is 'lots'"),
                       (["--older-than", "-1"], "--older-than is -1 days"),
                       (["--older-than", "nan"], "--older-than is nan days")):
        code, out = _run("prune", "--cache-dir", str(tmp_path), *args)
        assert code == 1 and out.startswith(f"Error: {what}") and len(out.splitlines()) == 1
    monkeypatch.setenv("NSYSAN_CACHE_MAX", "20 gigs")
    with pytest.raises(ConfigError, match="NSYSAN_CACHE_MAX is '20 gigs'"):
        open_trace(DDP, cache_dir=tmp_path, frame_cache=True)
    code, out = _run("list", "--cache-dir", str(tmp_path))
    assert code == 1 and out.startswith("Error: NSYSAN_CACHE_MAX is '20 gigs'")
    # also for a trace too small to be cached (its first analysis, not the first big one),
    # unless the cache is off
    small = REPO_ROOT / "fixtures" / "example_ddp.sqlite"
    with pytest.raises(ConfigError, match="NSYSAN_CACHE_MAX is '20 gigs'"):
        open_trace(small, cache_dir=tmp_path)
    assert open_trace(small, cache_dir=tmp_path, frame_cache=False).frame("gpu_ops").height
    monkeypatch.setenv("NSYSAN_NO_CACHE", "1")
    assert open_trace(small, cache_dir=tmp_path).frame("gpu_ops").height


def test_prune_says_what_it_removed_and_which_folders_stay(tmp_path: Path) -> None:
    """The bytes reported are the files removed (a write in progress is kept, not counted),
    a folder that stays is named as staying, and it keeps its time of last use."""
    ddp, layers = _cache(DDP, tmp_path), _cache(LAYERS, tmp_path)
    young = ddp / f".gpu_ops.{'a' * 32}.tmp"  # a write in progress
    young.write_bytes(b"x" * 1000)
    (layers / "keep.txt").write_text("mine")
    _aged(ddp, 3), _aged(layers, 2)
    ours = {f: _files_bytes(f) - extra for f, extra in ((ddp, 1000), (layers, 4))}
    code, out = _run("prune", "--cache-dir", str(tmp_path), "--all", "--dry-run")
    assert code == 0 and ddp.is_dir() and (ddp / "gpu_ops.arrow").exists()
    assert f"would remove 2 trace(s), {_size(sum(ours.values()))}" in out
    assert "2 folder(s) left, 1000 B" in out  # (the young write; the user's file is not ours)
    removed = prune(tmp_path / "frames", everything=True)
    assert [(r.folder, r.bytes, r.folder_kept) for r in removed] == [
        (ddp, ours[ddp], True), (layers, ours[layers], True)]
    assert sorted(p.name for p in ddp.iterdir()) == [young.name]
    for folder, days in ((ddp, 3), (layers, 2)):  # still their last use, not now
        assert abs(folder.stat().st_mtime - (time.time() - days * DAY)) < 60
    young.unlink()
    code, out = _run("prune", "--cache-dir", str(tmp_path), "--all")
    # the empty folder goes; the one holding only the user's file is not a removal again
    assert code == 0 and "removed 1 trace(s), 0 B; 1 folder(s) left" in out
    assert "its folder stays" not in out and not ddp.exists() and layers.is_dir()
    # and the folder left with only the user's file is no cached trace
    code, out = _run("list", "--cache-dir", str(tmp_path))
    assert code == 0 and out.startswith("0 cached trace(s), 0 B") and (
        "1 other folder(s) hold no frames" in out)
    code, out = _run("list", "--cache-dir", str(tmp_path), "--json")
    doc = json.loads(out)
    assert doc["traces"] == [] and doc["folders_without_frames"] == [str(layers)]


def test_a_folder_written_during_a_prune_keeps_its_new_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nsysan.load import cache_space

    ddp = _cache(DDP, tmp_path)
    _aged(ddp, 3)
    real = os.unlink

    def unlink_while_another_writes(name: str, *args: object, **kwargs: object) -> None:
        real(name, *args, **kwargs)  # type: ignore[arg-type]
        fresh = ddp / "nvtx.arrow"
        if not fresh.exists():
            fresh.write_bytes(b"x")  # another analysis stores a frame meanwhile

    monkeypatch.setattr(cache_space.os, "unlink", unlink_while_another_writes)
    removed = prune(tmp_path / "frames", everything=True)
    assert removed[0].folder_kept and (ddp / "nvtx.arrow").exists()
    assert time.time() - ddp.stat().st_mtime < 60  # its newer use, not 3 days ago


def test_a_write_in_progress_still_counts_against_the_bound(tmp_path: Path) -> None:
    # removing the older trace leaves its young temporary file: if that keeps the cache over
    # the bound, the next least recently used trace goes too
    ddp, layers = _cache(DDP, tmp_path), _cache(LAYERS, tmp_path)
    big = 200_000
    (ddp / f".nvtx.{'b' * 32}.tmp").write_bytes(b"x" * big)
    _aged(ddp, 3), _aged(layers, 1)
    bound = big + _files_bytes(layers) // 2  # (the young file alone fits; with layers, not)
    removed = prune(tmp_path / "frames", max_total=bound)
    assert [r.folder for r in removed] == [ddp, layers]
    assert sum(e.bytes for e in entries(tmp_path / "frames")) <= bound


def _size(n: int) -> str:
    from nsysan.cli_cache import _size as size

    return size(n)


def test_a_file_written_during_a_prune_is_not_taken_off_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a frame stored into the least recently used trace after the cache was listed: its
    # removal must not count bytes the listed total never held, or the prune stops early
    from nsysan.load import cache_space

    ddp, layers = _cache(DDP, tmp_path), _cache(LAYERS, tmp_path)
    _aged(ddp, 3), _aged(layers, 1)
    listed = cache_space.entries

    def listed_then_written(root: Path) -> list:
        found = listed(root)
        (ddp / "cpu_samples.arrow").write_bytes(b"x" * 300_000)
        return found

    monkeypatch.setattr(cache_space, "entries", listed_then_written)
    removed = prune(tmp_path / "frames", max_total=_files_bytes(layers) - 1)
    assert [r.folder for r in removed] == [ddp, layers]
