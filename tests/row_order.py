"""Row-shuffled copies of nsys SQLite exports, for the determinism tests.

Nsight Systems 2025.6+ does not promise the physical order of exported rows, so every nsysan
output must be the same for two exports that list the same rows in different orders.
`shuffled_copy` makes such a second export: each table is rebuilt from its own DDL (so column
types, constraints and the indexes nsys declared stay as nsys wrote them) and refilled in a
seeded pseudo-random order of its rows. ``INTEGER PRIMARY KEY`` columns (StringIds.id) keep
their values: only the order and the rowids of other tables change.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path

#: a permutation of rowids: (a * rowid + seed) mod p, p prime, a coprime to p
_P = 2_147_483_647
_A = 1_103_515_245


def table_names(path: Path) -> list[str]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name")]
    finally:
        con.close()


def shuffled_copy(src: Path, dst: Path, *, seed: int = 1,
                  tables: Iterable[str] | None = None) -> list[str]:
    """Copy ``src`` to ``dst`` with the rows of ``tables`` (default: every table) in another
    physical order; returns the tables whose order changed."""
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    con = sqlite3.connect(dst, isolation_level=None)
    changed = []
    try:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        con.execute("PRAGMA legacy_alter_table = ON")  # a rename must not rewrite other DDL
        wanted = None if tables is None else set(tables)
        ddl = con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND "
                          "name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()
        indexes = con.execute("SELECT tbl_name, sql FROM sqlite_master WHERE type = 'index' "
                              "AND sql IS NOT NULL").fetchall()
        con.execute("BEGIN")
        for name, sql in ddl:
            if wanted is not None and name not in wanted:
                continue
            n = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
            if n < 2:
                continue
            old = f"_shuffle_{name}"
            con.execute(f'ALTER TABLE "{name}" RENAME TO "{old}"')
            con.execute(sql)
            con.execute(f'INSERT INTO "{name}" SELECT * FROM "{old}" '
                        f"ORDER BY ({_A} * rowid + {seed}) % {_P}")
            con.execute(f'DROP TABLE "{old}"')
            changed.append(name)
        for table, sql in indexes:  # dropped with their tables: declared again
            if table in changed:
                con.execute(sql)
        con.execute("COMMIT")
    finally:
        con.close()
    return changed
