"""Input hashes for the manifest computed in the background (`prefetch_sha256`) are the hashes
of the files as they are when the manifest is written: a prefetched hash is used once, and
never for a file that changed since."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from nsysan.report import manifest
from nsysan.report.manifest import describe_path, prefetch_sha256, sha256_file


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_prefetched_hash_is_the_files_hash(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "in.sqlite"
    f.write_bytes(b"x" * (3 << 20))
    prefetch_sha256([f])
    calls: list[Path] = []
    real = manifest._hash_now
    monkeypatch.setattr(manifest, "_hash_now", lambda p: calls.append(p) or real(p))
    assert sha256_file(f) == _sha(b"x" * (3 << 20))
    assert calls == []  # served by the background thread
    assert sha256_file(f) == _sha(b"x" * (3 << 20))
    assert calls == [f]  # used once: a later manifest hashes again


def test_a_file_changed_after_the_prefetch_is_hashed_again(tmp_path: Path) -> None:
    f = tmp_path / "in.sqlite"
    f.write_bytes(b"old contents")
    prefetch_sha256([f])
    f.write_bytes(b"new contents, longer")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert sha256_file(f) == _sha(b"new contents, longer")


def test_directories_and_missing_paths(tmp_path: Path) -> None:
    d = tmp_path / "frames.parquetdir"
    (d / "sub").mkdir(parents=True)
    (d / "a.parquet").write_bytes(b"a")
    (d / "sub" / "b.parquet").write_bytes(b"b")
    want = describe_path(d)
    prefetch_sha256([d, tmp_path / "absent.sqlite"])  # nothing to hash for a missing path
    assert describe_path(d) == want
    assert describe_path(tmp_path / "absent.sqlite")["kind"] == "missing"


def test_write_report_hashes_the_inputs_while_drawing(tmp_path: Path, monkeypatch) -> None:
    """`write_report` starts hashing the inputs before the pictures are drawn (they overlap),
    and the manifest lists the input's true hash."""
    from findings_cases import scenario

    from nsysan.findings import diagnose
    from nsysan.report import plots
    from nsysan.report.write import write_report

    src = tmp_path / "input.sqlite"
    src.write_bytes(b"y" * (2 << 20))
    tr, res = scenario("starved_input")
    tr.meta.path = tr.meta.source_path = src
    pending_when_drawn: list[bool] = []
    real = plots.binned_timelines

    def spy(*args, **kwargs):
        key = manifest._stat_key(src)
        with manifest._PENDING_LOCK:
            pending_when_drawn.append(key in manifest._PENDING)
        return real(*args, **kwargs)

    monkeypatch.setattr(plots, "binned_timelines", spy)
    out = tmp_path / "out"
    write_report(out, tr, res, diagnose(tr, res))
    # (one binning: the pictures' bins and report.html's finer ones at once)
    assert pending_when_drawn[:1] == [True]
    import json

    doc = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert doc["inputs"][0]["sha256"] == _sha(b"y" * (2 << 20))
    assert manifest._stat_key(src) not in manifest._PENDING  # served (used once)


def test_a_cached_trace_keeps_the_digest_of_its_input(tmp_path: Path, monkeypatch) -> None:
    """An analysis whose frames come from the frame cache takes the input's sha256 from there
    (a 9 GB export took 7 s of CPU to hash), for that very version of the file only; the
    manifest lists the true hash every time."""
    from export_mutations import EXAMPLE, copy_export

    from nsysan.api import analyze_to_dir
    from nsysan.load import cache, open_trace

    src = copy_export(EXAMPLE, tmp_path / "in" / "t.sqlite")
    hashed: list[Path] = []
    real = manifest._hash_now

    def spy(p: Path) -> str:
        if Path(p) == src:  # (the outputs are hashed too)
            hashed.append(src)
        return real(p)

    monkeypatch.setattr(manifest, "_hash_now", spy)

    def run(n: int) -> str:
        trace = open_trace(src, frame_cache=True, cache_dir=tmp_path / "cache")
        _, out = analyze_to_dir(trace, tmp_path / f"out{n}")
        cache.flush()
        data = json.loads(next(out.rglob("manifest.json")).read_text())
        [entry] = [i for i in data["inputs"] if Path(i["path"]).name == "t.sqlite"]
        return entry["sha256"]

    want = _sha(src.read_bytes())
    assert run(1) == want and hashed == [src]  # computed, and kept beside the frames
    folder = open_trace(src, frame_cache=True, cache_dir=tmp_path / "cache").meta.frame_cache
    assert folder is not None and (folder / cache.DIGEST_FILE).is_file()
    assert run(2) == want and hashed == [src]  # taken from the cache: not hashed again
    # another version of the file (same size, same contents even): hashed again
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert run(3) == want and hashed == [src, src]
    # a damaged digest file is not believed
    (folder / cache.DIGEST_FILE).write_text('{"file": [1, 2], "sha256": "00"}')
    assert cache.stored_digest(folder, src) is None
