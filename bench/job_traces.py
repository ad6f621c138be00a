"""A job of many ranks for the memory and batch benchmarks: one scaled SQLite export per rank.

    python bench/job_traces.py [--ranks 16] [--kernels 250000] [-o bench/data/job16]

Rank ``r`` of the new job is a copy of the shared sc22 capture (rank 0 of a 4-rank PyTorch DDP
run with NCCL all-reduces, CPU samples and context switches), scaled with `scale_trace.scale`
to at least ``--kernels`` kernels (activity replicated along the timeline, ids kept consistent
within the file), and told its new rank where nsys records it: the launch environment in
``TARGET_INFO_SYSTEM_ENV.DeviceEnvironment`` (``RANK``, ``LOCAL_RANK``, ``PALS_RANKID`` and
``WORLD_SIZE``). Files are named ``rank<r>.sqlite``. Every rank runs the same collectives, so
``nsysan analyze --job`` matches them across all ranks. (The MPI Jacobi captures are the other
multi-rank source, but they hold 140 call-stack frames per kernel: 16 scaled copies would
take 40 GB.)
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scale_trace import scale  # noqa: E402

SOURCE = (HERE.parent.parent / "shared" / "traces" / "sc22-ddp-4gpu-nccl"
          / "4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite")
#: (variable, value in the source) -> value for rank r of a job of size n
RETAG = {"RANK": lambda r, n: r, "LOCAL_RANK": lambda r, n: r % 4,
         "PALS_RANKID": lambda r, n: r, "WORLD_SIZE": lambda r, n: n}


def _retag(path: Path, rank: int, world: int) -> None:
    """Give the copy its rank and the job's size in its recorded launch environment."""
    con = sqlite3.connect(path)
    con.text_factory = bytes  # the environment block holds NULs and non-UTF-8 bytes
    try:
        for (value,) in con.execute(
                "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'"):
            items = value.split(b"\0")
            for i, item in enumerate(items):
                name, sep, _ = item.partition(b"=")
                if sep and name.decode(errors="replace") in RETAG:
                    new = RETAG[name.decode()](rank, world)
                    items[i] = name + b"=" + str(new).encode()
            con.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = CAST(? AS TEXT) "
                        "WHERE name = 'DeviceEnvironment'", (b"\0".join(items),))
        con.commit()
    finally:
        con.close()


def kernels_of(path: Path) -> int:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0])
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--kernels", type=int, default=250_000)
    ap.add_argument("-o", "--out", type=Path, default=HERE / "data" / "job16")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    copies = max(1, math.ceil(args.kernels / kernels_of(SOURCE)))
    for rank in range(args.ranks):
        dst = args.out / f"rank{rank}.sqlite"
        scale(SOURCE, dst, copies)
        _retag(dst, rank, args.ranks)
        print(f"{dst}: rank {rank}, {copies} copies", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
