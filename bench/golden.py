"""Golden outputs: the sha256 of every output file of ``nsysan analyze`` on a set of traces.

    python bench/golden.py record GOLDEN.json [--traces DIR] [--extra TRACE ...] [--work DIR]
    python bench/golden.py check GOLDEN.json [--traces DIR] [--extra TRACE ...] [--work DIR]

Why: a restructuring (issue 17) must leave every output byte-identical. ``record`` analyses
every SQLite export and parquetdir under ``--traces`` (default: ../shared/traces), each with
``nsysan analyze`` in a fresh process into its own folder of a temporary directory (caches
there too, never next to the traces), plus a multi-rank job of the jacobi pair, plus any
``--extra`` trace (e.g. a scaled 1M-kernel copy from bench/scale_trace.py); it writes one
JSON: case -> output file -> sha256. ``check`` does the same and lists every case and file
whose hash differs, is missing or is new; exit 1 when any does.

Which nsysan runs is whichever ``python -c 'import nsysan'`` finds (set PYTHONPATH to record a
base commit's outputs from a ``git worktree`` of it). Volatile content is left out before
hashing: in ``manifest.json`` the creation time, the command line and the timings (the hashes
of the outputs it lists stay in); in the ownership marker (``.nsysan-output.json``) every
field naming a time. Everything else is hashed as written.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "traces"
#: manifest.json fields that change from run to run of the same input
MANIFEST_VOLATILE = ("created_utc", "command", "timings_s")
MARKER = ".nsysan-output.json"
#: the two ranks of one MPI job in the shared traces: analysed together with ``--job`` too
JOB = ("gpubootcamp-jacobi-multigpu/mpi_report1.qdrep.nsys2022.4.2.sqlite",
       "gpubootcamp-jacobi-multigpu/mpi_report2.qdrep.nsys2022.4.2.sqlite")


def cases(traces: Path, extra: Iterable[Path] = ()) -> dict[str, list[str]]:
    """Case name -> ``nsysan analyze`` arguments (without ``-o``), sorted by name."""
    found: dict[str, list[str]] = {}
    # resolved: the outputs name the input's path, which must not depend on how it was reached
    traces = traces.resolve()
    extra = [p.resolve() for p in extra]
    if traces.is_dir():
        for p in sorted([*traces.glob("*/*.sqlite"), *traces.glob("*/*.parquetdir")]):
            found[f"{p.parent.name}/{p.name}"] = [str(p)]
        if all((traces / j).is_file() for j in JOB):
            found["job:" + JOB[0].split("/")[0]] = ["--job", *(str(traces / j) for j in JOB)]
    for p in extra:
        found[f"extra/{p.name}"] = [str(p)]
    return dict(sorted(found.items()))


def stable_bytes(path: Path) -> bytes:
    """The bytes of ``path`` that must not change between runs (see the module docstring)."""
    data = path.read_bytes()
    if path.name == "manifest.json":
        doc = json.loads(data)
        for key in MANIFEST_VOLATILE:
            doc.pop(key, None)
        return json.dumps(doc, sort_keys=True).encode()
    if path.name == MARKER:
        doc = json.loads(data)
        return json.dumps({k: v for k, v in doc.items() if "time" not in k and "utc" not in k},
                          sort_keys=True).encode()
    return data


def hash_tree(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of `stable_bytes` of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(stable_bytes(p)).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file()
    }


def run_case(args: list[str], out: Path, cache: Path) -> dict[str, str]:
    env = {**os.environ, "NSYSAN_CACHE_DIR": str(cache), "NSYSAN_NO_CACHE": "1"}
    proc = subprocess.run([sys.executable, "-m", "nsysan", "analyze", *args, "-o", str(out),
                           "-q"], env=env, capture_output=True, text=True)
    tree = hash_tree(out) if out.is_dir() else {}
    tree["<exit status>"] = str(proc.returncode)
    if proc.returncode not in (0, 3):
        tree["<stderr>"] = proc.stderr.strip()[-500:]
    return tree


def record(case_args: Mapping[str, list[str]], work: Path) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for i, (name, args) in enumerate(case_args.items()):
        print(f"  {name}", file=sys.stderr, flush=True)
        out[name] = run_case(args, work / f"case{i}", work / "cache")
    return out


def differences(want: Mapping[str, Mapping[str, str]],
                got: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One line per case or file that differs between two recordings."""
    lines = []
    for case in sorted(want.keys() | got.keys()):
        if case not in got:
            lines.append(f"{case}: not analysed")
            continue
        if case not in want:
            lines.append(f"{case}: new case")
            continue
        a, b = want[case], got[case]
        for f in sorted(a.keys() | b.keys()):
            if a.get(f) != b.get(f):
                what = "missing" if f not in b else "new" if f not in a else "differs"
                lines.append(f"{case}: {f} {what}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("record", "check"))
    ap.add_argument("golden", type=Path)
    ap.add_argument("--traces", type=Path, default=SHARED)
    ap.add_argument("--extra", type=Path, nargs="*", default=[])
    ap.add_argument("--work", type=Path, default=None, help="where outputs go (default: tmp)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nsysan-golden-") as tmp:
        got = record(cases(a.traces, a.extra), a.work or Path(tmp))
    if a.mode == "record":
        a.golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(got)} cases, {sum(map(len, got.values()))} files -> {a.golden}")
        return 0
    diff = differences(json.loads(a.golden.read_text()), got)
    for line in diff:
        print(line)
    print(f"{len(got)} cases: " + ("identical" if not diff else f"{len(diff)} differences"))
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
