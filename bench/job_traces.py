"""A job of many ranks for the memory and batch benchmarks: one scaled SQLite export per rank.

    python bench/job_traces.py [--ranks 16] [--kernels 250000] [-o bench/data/job16]

The shared MPI Jacobi capture has one report per rank (ranks 3 and 7 of an 8-rank run). Rank
``r`` of the new job is a copy of one of them (``r`` even: rank 3's, odd: rank 7's), scaled with
`scale_trace.scale` to about ``--kernels`` kernels (activity replicated along the timeline, ids
kept consistent within the file), and told its new rank where nsys records it: the launch
environment (``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE`` in
``TARGET_INFO_SYSTEM_ENV.DeviceEnvironment``) and the ``MPI Rank N`` thread name. Files are
named ``rank<r>.sqlite``. Every rank then runs the same number of collectives, so
``nsysan analyze --job`` matches them across all ranks.
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

JACOBI = HERE.parent.parent / "shared" / "traces" / "gpubootcamp-jacobi-multigpu"
SOURCES = {3: JACOBI / "mpi_report1.qdrep.nsys2022.4.2.sqlite",
           7: JACOBI / "mpi_report2.qdrep.nsys2022.4.2.sqlite"}


def _retag(path: Path, old_rank: int, rank: int, world: int) -> None:
    """Give the copy of rank ``old_rank`` its new rank (environment and thread name)."""
    con = sqlite3.connect(path)
    con.text_factory = bytes  # the environment block holds NULs and non-UTF-8 bytes
    try:
        for (value,) in con.execute(
                "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'"):
            new = value.replace(f"OMPI_COMM_WORLD_RANK={old_rank}\0".encode(),
                                f"OMPI_COMM_WORLD_RANK={rank}\0".encode())
            new = new.replace(b"OMPI_COMM_WORLD_SIZE=8\0", f"OMPI_COMM_WORLD_SIZE={world}\0"
                              .encode())
            con.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = CAST(? AS TEXT) "
                        "WHERE name = 'DeviceEnvironment'", (new,))
        con.execute("UPDATE StringIds SET value = ? WHERE value = ?",
                    (f"MPI Rank {rank}", f"MPI Rank {old_rank}"))
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
    for rank in range(args.ranks):
        old = 3 if rank % 2 == 0 else 7
        src = SOURCES[old]
        copies = max(1, math.ceil(args.kernels / kernels_of(src)))
        dst = args.out / f"rank{rank}.sqlite"
        scale(src, dst, copies)
        _retag(dst, old, rank, args.ranks)
        print(f"{dst}: rank {rank} from rank {old}, {copies} copies", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
