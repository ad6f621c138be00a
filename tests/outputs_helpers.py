"""Helpers of the output-ownership and fault tests: the CLI in-process and as a process, a
parquetdir copy of an export, a dead process id, a snapshot of a tree, a small tmpfs."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result
from conftest import unavailable

import nsysan

ROOT = Path(__file__).resolve().parents[1]
#: where the nsysan this test process imported lives: the processes started run the same one
PACKAGE_ROOT = Path(nsysan.__file__).resolve().parents[1]
EXAMPLE = ROOT / "fixtures" / "example_ddp.sqlite"
LAYERS = ROOT / "fixtures" / "example_layers.sqlite"


def cli(*args: str | os.PathLike[str], env: dict[str, str] | None = None) -> Result:
    """``nsysan ARGS`` in this process (click's runner: stdout and stderr apart)."""
    from nsysan.cli import cli as group

    return CliRunner().invoke(group, [os.fspath(a) for a in args], env=env,
                              catch_exceptions=False)


def nsysan(*args: str | os.PathLike[str], cwd: Path | None = None,
           env: dict[str, str] | None = None, timeout: float = 300
           ) -> subprocess.CompletedProcess[str]:
    """``nsysan ARGS`` as a process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "nsysan", *map(os.fspath, args)],
                          capture_output=True, text=True, check=False, timeout=timeout,
                          cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), **(env or {})})


def one_error_line(stderr: str) -> str:
    """The single ``Error: ...`` line of ``stderr`` (fails on a traceback or more lines)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    return lines[0]


def to_parquetdir(sqlite_path: Path, dest: Path) -> Path:
    """A parquetdir export (one ``<TABLE>.parquet`` per table) of an SQLite export."""
    dest.mkdir(parents=True)
    con = sqlite3.connect(sqlite_path)
    try:
        tables = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            cur = con.execute(f'SELECT * FROM "{table}"')
            cols = [d[0] for d in cur.description]
            pl.DataFrame(cur.fetchall(), schema=cols, orient="row",
                         infer_schema_length=None).write_parquet(dest / f"{table}.parquet")
    finally:
        con.close()
    return dest


def dead_pid() -> int:
    """The id of a process of this host that has ended (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every entry under ``roots`` (not following links): kind, inode, and for files mtime and
    sha256 of the contents; for links the target."""
    found: dict[str, tuple] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                p = Path(dirpath) / name
                st = p.lstat()
                if p.is_symlink():
                    found[str(p)] = ("link", st.st_ino, os.readlink(p))
                elif p.is_dir():
                    found[str(p)] = ("dir", st.st_ino)
                else:
                    digest = hashlib.sha256(p.read_bytes()).hexdigest()
                    found[str(p)] = ("file", st.st_ino, st.st_mtime_ns, digest)
        found[str(root)] = ("dir", root.lstat().st_ino)
    return found


def assert_untouched(before: dict[str, tuple], after: dict[str, tuple]) -> None:
    """Every entry of ``before`` is still there, the same inode, unchanged."""
    changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    assert not changed, changed


def temp_entries(*roots: Path) -> list[str]:
    """Temporary entries (nsysan's, or the names earlier versions used) anywhere under
    ``roots``."""
    found = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            found += [str(Path(dirpath) / n) for n in [*dirnames, *filenames]
                      if n.startswith(".") and any(t in n for t in (
                          ".nsysan-tmp-", ".nsysan-old-", ".tmp-", ".old-"))]
    return sorted(found)


@contextlib.contextmanager
def tmpfs(where: Path, size: str = "4m", *, read_only: bool = False) -> Iterator[Path]:
    """A small tmpfs mounted at ``where`` (made), unmounted afterwards, for the full and
    read-only file-system cases. Skips — under CI too — only where mounting is impossible:
    not root, or a container without the capability (the kernel's "permission denied");
    any other failure to mount skips locally and fails under CI."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the full and read-only file system cases)")
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip()
        if any(s in why.lower() for s in ("permission denied", "not permitted", "only root")):
            pytest.skip(f"mounting a tmpfs is not permitted here: {why}")
        unavailable(f"mount -t tmpfs failed: {why}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
