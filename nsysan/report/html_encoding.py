"""The compact encoding of report.html's timeline payload, and the selection that bounds it.

`html_data` decides what the page draws; this module holds how it is written and chosen: the
string table (`Strings`: each name once, Categorical names kept as codes until then), the blob
of typed columns deflated as they are added and sent as base64 (`Blob`), shares as one byte
each (`share_bytes`), and the passes that keep memory bounded on ten million rows: `CHUNK` rows
at a time (`chunks`), the longest rows past a cap by a partial selection (`longest`), ties
ordered by several keys (`lex_order`). It is separate because none of it knows GPU ops, lanes
or NVTX ranges, and each helper is checked on its own against its definition.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

#: rows per step of a pass over all GPU ops or NVTX ranges: what the page needs of ten
#: million ops is read a chunk at a time, so the transient arrays stay a few MB
CHUNK = 1 << 20


@dataclass
class Blob:
    """Typed columns appended one after the other (8-byte aligned), described by `layout`.

    Each column is deflated as it is added (one stream: the same bytes as deflating the
    columns joined), so that the raw columns are never all held at once."""

    layout: dict[str, dict[str, Any]] = field(default_factory=dict)
    size: int = 0
    _deflate: Any = field(default_factory=lambda: zlib.compressobj(1))
    _out: list[bytes] = field(default_factory=list)

    def add(self, name: str, values: np.ndarray) -> None:
        values = np.asarray(values)
        top = int(values.max()) if values.size else 0
        if values.size and int(values.min()) < 0:
            raise ValueError(f"{name}: negative values cannot be packed")
        dtype = next((t for t in (np.uint8, np.uint16, np.uint32) if top <= np.iinfo(t).max),
                     np.float64)
        raw = np.ascontiguousarray(values.astype("<" + np.dtype(dtype).str[1:]))
        self.layout[name] = {"type": np.dtype(dtype).name, "offset": self.size,
                             "length": int(values.size)}
        pad = (-raw.nbytes) % 8
        if self._deflate is None:
            raise ValueError("the blob was encoded already")
        self._out.append(self._deflate.compress(raw))
        self._out.append(self._deflate.compress(b"\0" * pad))
        self.size += raw.nbytes + pad

    def encode(self) -> str:
        # level 1: deterministic for the same bytes; on the 1M-kernel trace 0.46 s for 6.0 MB
        # where level 6 takes 1.5 s for 5.4 MB
        if self._deflate is not None:  # (the stream ends once; encode may be asked again)
            self._out = [b"".join([*self._out, self._deflate.flush()])]
            self._deflate = None
        return base64.b64encode(self._out[0]).decode("ascii")


def _distinct(names: pl.Series) -> tuple[np.ndarray, pl.Series]:
    """A Categorical or Enum column by its distinct values: per row, the index of its value
    among them, and those values (null included) in the order of first use. Only the codes
    of the rows are read: no row's text is made."""
    phys = names.to_physical()
    first = phys.arg_unique()
    codes = phys.cast(pl.Int64).fill_null(-1).to_numpy()
    seen = codes[first.to_numpy()]
    by_code = np.argsort(seen)
    return by_code[np.searchsorted(seen[by_code], codes)], names.gather(first)


def text_rank(names: pl.Series) -> np.ndarray:
    """Per row of a Categorical column, the rank of its text among the column's distinct
    texts, nulls last: ordering by it orders as polars sorts the column (by its text)."""
    pos, values = _distinct(names)
    texts = values.cast(pl.String).to_list()
    by_text = sorted(range(len(texts)), key=lambda i: (texts[i] is None, texts[i] or ""))
    rank = np.empty(len(texts), np.int32)  # (a sort key per kept row: 4 bytes)
    rank[by_text] = np.arange(len(texts))
    return rank[pos]


class Strings:
    """A string table: each distinct name once, in the order of first use (deterministic
    because every caller adds names in a sorted order)."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def _add(self, text: str) -> int:
        if text not in self._index:
            self._index[text] = len(self.values)
            self.values.append(text)
        return self._index[text]

    def index(self, names: pl.Series) -> np.ndarray:
        """The table index of each of ``names`` (null -> the empty string). Categorical
        names stay codes: only the distinct ones become text."""
        if isinstance(names.dtype, (pl.Categorical, pl.Enum)):
            pos, values = _distinct(names)
            table = np.array([self._add(t) for t in
                              values.cast(pl.String).fill_null("").to_list()], np.uint32)
            return table[pos]
        s = names.cast(pl.String).fill_null("")
        uniq = s.unique(maintain_order=True).to_list()
        mapping = pl.DataFrame({"_n": uniq, "_i": [self._add(u) for u in uniq]},
                               schema={"_n": pl.String, "_i": pl.UInt32})
        return (pl.DataFrame({"_n": s}).join(mapping, on="_n", how="left",
                                             maintain_order="left")["_i"].to_numpy())


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.uint8).tobytes()).decode("ascii")


def share_bytes(share: np.ndarray) -> str:
    """Shares in [0, 1] as one byte each (0..255), base64."""
    return _b64(np.clip(np.rint(np.nan_to_num(share) * 255), 0, 255).astype(np.uint8))


# ---------------------------------------------------------------------------------------------
# Reading millions of rows in bounded memory
# ---------------------------------------------------------------------------------------------
def chunks(n: int) -> Iterator[tuple[int, int]]:
    return ((a, min(a + CHUNK, n)) for a in range(0, n, CHUNK))


def ints(s: pl.Series, fill: int = 0) -> np.ndarray:
    """An integer column as int64 numpy (a view of it when it has no null), nulls as ``fill``."""
    return (s.fill_null(fill) if s.null_count() else s).cast(pl.Int64).to_numpy()


def lex_order(keys: list[np.ndarray]) -> np.ndarray:
    """The row order that sorts by ``keys[0]``, then ``keys[1]``, ... (ascending): a stable
    sort by the first two keys, the others compared only among rows tied on those (few)."""
    order = np.lexsort((keys[1], keys[0]))
    if len(keys) > 2 and order.size > 1:
        k0, k1 = keys[0][order], keys[1][order]
        tie = (k0[1:] == k0[:-1]) & (k1[1:] == k1[:-1])
        del k0, k1
        if tie.any():
            run = np.concatenate([[0], np.cumsum(~tie)])
            tied = np.zeros(order.size, bool)
            tied[1:] |= tie
            tied[:-1] |= tie
            pos = np.flatnonzero(tied)
            rows = order[pos]
            order[pos] = rows[np.lexsort([k[rows] for k in reversed(keys[2:])] + [run[pos]])]
    return order


def longest(n: int, durations: Callable[[int, int], np.ndarray], cap: int,
            tie_order: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, int]:
    """The rows (ascending) of the at most ``cap`` longest of ``n`` rows, and how many rows
    there were to choose from. ``durations(a, b)``: the durations of rows ``a:b``, -1 for a
    row that is not drawn; ``tie_order(rows)``: rows of equal duration, best first.

    What `html_data._capped` does, without sorting every row by every column: the cap's
    duration is found chunk by chunk (a partial selection of at most ``cap + CHUNK``
    durations), and only the rows that have exactly that duration are ordered by their other
    columns."""
    total = 0
    top = np.zeros(0, np.int64)  # the longest durations seen so far (at most cap of them)
    for a, b in chunks(n):
        d = durations(a, b)
        d = d[d >= 0]
        total += d.size
        if cap and top.size >= cap:
            d = d[d >= top.min()]
        if cap and d.size:
            top = np.concatenate([top, d])
            if top.size > cap:
                top = np.partition(top, top.size - cap)[top.size - cap:]
    over: list[np.ndarray] = []
    tied: list[np.ndarray] = []
    if total <= cap:
        for a, b in chunks(n):
            over.append(a + np.flatnonzero(durations(a, b) >= 0))
    elif cap:
        threshold = top.min()
        for a, b in chunks(n):
            d = durations(a, b)
            over.append(a + np.flatnonzero(d > threshold))
            tied.append(a + np.flatnonzero(d == threshold))
    rows = np.concatenate([np.zeros(0, np.int64), *over])
    if tied:
        ties = np.concatenate(tied)
        need = cap - rows.size
        rows = np.sort(np.concatenate([rows, tie_order(ties)[:need] if ties.size > need
                                       else ties]))
    return rows, total


def rank(values: np.ndarray, col: pl.Series) -> np.ndarray:
    """The position of each of ``col`` among the sorted distinct ``values`` (null: after
    them)."""
    pos = np.searchsorted(values, ints(col))
    if col.null_count():
        pos[col.is_null().to_numpy()] = values.size
    return pos
