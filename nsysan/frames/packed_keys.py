"""One sortable Int64 key per (group, time): the fast path of the interval kernel.

Sorting by several columns costs about three times a sort by one Int64 column, and polars
window functions (``.over``) cost far more than plain scans. So the interval functions pack the
group columns and a time into one Int64, ``group_code * span + offset(time)``, and work on that:

* the group code is ordered like ``sort(by)`` orders the groups (nulls first), so sorting the
  keys sorts by group, then time;
* every key of group ``g`` lies in ``[g * span, (g + 1) * span)``: a running max or an as-of
  join over the whole sorted key column never lets an earlier group leak into a later one,
  because every key of an earlier group is smaller than any key of the later group.

The offset is ``time - min time`` when the packed range fits in 62 bits, otherwise the dense
rank of the time among all times (only order and equality matter to the algorithms); group
codes fall back to dense ranks the same way. Decoding gives the original values back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

#: packed keys (times ``low`` plus low bits) stay below this, leaving headroom for +1 / sums
LIMIT = 1 << 62
GROUP = "_g"


def _dense(code: pl.Series) -> tuple[pl.Series, int]:
    """Dense 0-based codes of ``code`` (same order) and their count."""
    ranked = code.rank("dense").cast(pl.Int64) - 1
    return ranked, int(ranked.max() or 0) + 1  # type: ignore[arg-type]


def _dense_array(code: np.ndarray) -> tuple[np.ndarray, int]:
    """`_dense` of an array of codes, as a new writable array."""
    ranked, n = _dense(pl.Series(code))
    return ranked.to_numpy(writable=True), n


def _column_codes(col: pl.Series) -> tuple[np.ndarray, int, int | None]:
    """Int64 code per value in a new writable array, ordered like polars sorts the values
    (null first, as 0), the number of possible codes, and for an integer offset code
    (``value - lo + 1``) its ``lo``."""
    if col.dtype.is_integer():
        lo, hi = col.min(), col.max()
        if lo is None:  # empty or all null
            return np.zeros(col.len(), np.int64), 1, 0
        n = int(hi) - int(lo) + 2  # type: ignore[arg-type]
        if n < LIMIT and int(hi) < 1 << 63:  # type: ignore[arg-type]
            nulls = col.null_count()
            code = (col.fill_null(lo) if nulls else col).to_numpy().astype(np.int64)
            code -= int(lo) - 1  # type: ignore[arg-type]
            if nulls:
                code[col.is_null().to_numpy()] = 0
            return code, n, int(lo)  # type: ignore[arg-type]
    ranked = col.rank("dense").cast(pl.Int64).fill_null(0)
    return ranked.to_numpy(writable=True), int(ranked.max() or 0) + 1, None  # type: ignore[arg-type]


class Keys:
    """Packs ``(by..., time)`` of the rows of one or more frames into sortable Int64 keys.

    ``frames`` all hold the ``by`` columns and the ``times`` columns (non-null); group codes are
    shared across frames, so keys of different frames compare. ``low`` reserves room for that
    many low-order values below each key (``key * low + extra``).
    """

    def __init__(self, frames: Sequence[pl.DataFrame], by: Sequence[str],
                 times: Sequence[str], low: int = 1) -> None:
        self._frames = list(frames)
        self._by = list(by)
        sizes = [f.height for f in self._frames]
        # The group code is built in one array, in place: as polars expressions, each column's
        # code and each product and sum were arrays of their own (four per column at the
        # peak: ~0.3 GB more for a distinct on two columns of 10M kernels).
        code: np.ndarray | None = None
        n_codes = 1
        # (column, dtype, offset, radix) per column while every code is an integer offset:
        # then the columns decode arithmetically, without a lookup table.
        self._radix: list[tuple[str, pl.DataType, int, int]] | None = []
        for c in self._by:
            col = (self._frames[0][c] if len(self._frames) == 1 else
                   pl.concat([f.select(c) for f in self._frames], how="vertical_relaxed")
                   .to_series())
            col_code, n, lo = _column_codes(col)
            if code is None:
                code = col_code
            else:
                if n_codes * n >= LIMIT:
                    code, n_codes = _dense_array(code)
                    self._radix = None
                    if n_codes * n >= LIMIT:  # this column's own range is too wide: rank it
                        col_code, n = _dense_array(col_code)
                code *= n
                code += col_code
            del col_code
            n_codes *= n
            if lo is None or self._radix is None:
                self._radix = None
            else:
                self._radix.append((c, col.dtype, lo, n))
        group = (pl.zeros(sum(sizes), pl.Int64, eager=True) if code is None
                 else pl.Series(self._by[0], code))  # (polars takes the array, no copy)
        del code
        # Min and max per column: concatenating every time column would copy them all.
        ts = [f[t] for f in self._frames for t in times]
        lows = [int(m) for m in (s.min() for s in ts) if m is not None]  # type: ignore[arg-type]
        highs = [int(m) for m in (s.max() for s in ts) if m is not None]  # type: ignore[arg-type]
        self._dtype = ts[0].dtype if ts else pl.Int64
        self._tmin = min(lows, default=0)
        self._uniq: pl.Series | None = None
        self.span = max(highs, default=0) - self._tmin + 1
        if n_codes * self.span * low >= LIMIT:
            # Only the order and equality of times matter: replace them by their dense rank.
            self._uniq = pl.concat([s.cast(pl.Int64) for s in ts]).drop_nulls().unique().sort()
            self.span = max(self._uniq.len(), 1)
            if n_codes * self.span * low >= LIMIT:
                group, n_codes = _dense(group)
                self._radix = None
            if n_codes * self.span * low >= LIMIT:  # pragma: no cover - > 2^28 rows
                raise ValueError("too many rows to pack interval keys")
        self._one_group = n_codes == 1
        self._lut: pl.DataFrame | None = None  # (`forget_rows`)
        self._codes = []
        offset = 0
        for size in sizes:
            self._codes.append(group.slice(offset, size))
            offset += size

    def forget_rows(self) -> Keys:
        """Drop the frames and the group code of every row (`pack` and `group_code` need
        them), keeping what decodes keys (`time`, `times`, `lengths`, `group`, `attach_by`):
        for an owner that keeps the keys with its packed rows for long (the sorted GPU ops
        of `nsysan.passes.device_blocks`: the frames would be held through the reports)."""
        if self._radix is None and self._lut is None:
            self._lut = self._group_table()
        self._frames, self._codes = [], []
        return self

    @property
    def dtype(self) -> pl.DataType:
        """The dtype of the time columns (what `time` gives back)."""
        return self._dtype

    def group_code(self, frame: int) -> pl.Series:
        """The group code of every row of frame ``frame``."""
        return self._codes[frame]

    def pack(self, frame: int, col: str) -> pl.Series:
        """The packed key of time column ``col`` of every row of frame ``frame``."""
        t = self._frames[frame][col].cast(pl.Int64)
        if self._uniq is None:
            off = t - self._tmin
        else:
            off = self._uniq.search_sorted(t.fill_null(0)).cast(pl.Int64)
            off = pl.select(pl.when(t.is_not_null()).then(off)).to_series()  # null stays null
        return (off if self._one_group else self._codes[frame] * self.span + off).alias(col)

    def time(self, key: pl.Expr, group: pl.Expr | None = None) -> pl.Expr:
        """The time (original dtype) encoded in a packed key; ``group``, the key's group code
        where it is at hand, saves a (slow) Int64 modulo."""
        if self._one_group:
            off = key
        elif group is not None:
            off = key - group * self.span
        else:
            off = key % self.span
        t = off + self._tmin if self._uniq is None else off.map_batches(self._gather, pl.Int64)
        return t.cast(self._dtype)

    def length(self, start: pl.Expr, end: pl.Expr) -> pl.Expr:
        """``time(end) - time(start)`` (Int64) for two keys of the same group."""
        if self._uniq is None:  # offsets: packed differences are time differences
            return end - start
        return self.time(end).cast(pl.Int64) - self.time(start).cast(pl.Int64)

    @property
    def one_group(self) -> bool:
        """True when every row is in one group: the packed keys are the times alone."""
        return self._one_group

    def times(self, key: np.ndarray, group: np.ndarray | None) -> np.ndarray:
        """`time` of a numpy array of packed keys whose group codes are ``group`` (Int64;
        None when `one_group`)."""
        if self._one_group:
            off = key + self._tmin if self._uniq is None else key
        else:  # (in one new array: ``key - group * span + tmin`` made three)
            assert group is not None
            off = np.multiply(group, self.span, dtype=np.int64)
            np.subtract(key, off, out=off)
            if self._uniq is None:
                off += self._tmin
        return off if self._uniq is None else self._uniq.to_numpy()[off]

    def lengths(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """`length` of numpy arrays of packed keys (pairs of the same group)."""
        if self._uniq is None:
            return end - start
        times = self._uniq.to_numpy()
        return times[end % self.span] - times[start % self.span]

    def _gather(self, off: pl.Series) -> pl.Series:
        assert self._uniq is not None
        return self._uniq.gather(off)

    def group(self, key: pl.Expr) -> pl.Expr:
        """The group code encoded in a packed key."""
        return key // self.span

    def attach_by(self, df: pl.DataFrame) -> pl.DataFrame:
        """Replace the ``_g`` column of ``df`` by the ``by`` columns it encodes (same place)."""
        names = df.columns
        i = names.index(GROUP)
        return df.select([*names[:i], *self._by_values(df[GROUP]), *names[i + 1:]])

    def _by_values(self, code: pl.Series) -> list[pl.Series]:
        if self._radix is not None:
            out = []
            for name, dtype, lo, n in reversed(self._radix):
                c = code % n
                value = pl.when(c > 0).then(c - 1 + lo)
                out.append(c.to_frame().select(value.cast(dtype).alias(name)).to_series())
                code = code // n
            return out[::-1]
        # Codes are ranks: look every value up in a table of the distinct groups.
        lut = self._lut if self._lut is not None else self._group_table()
        rows = lut[GROUP].search_sorted(code)
        return [lut[c].gather(rows) for c in self._by]


    def _group_table(self) -> pl.DataFrame:
        """The ``by`` values of every group code (a row per distinct group, by code)."""
        return pl.concat(
            [f.select(self._by).with_columns(c.alias(GROUP))
             for f, c in zip(self._frames, self._codes, strict=True)],
            how="vertical_relaxed",
        ).unique(GROUP).sort(GROUP)


def group_agg(df: pl.DataFrame, by: Sequence[str], last: str,
              aggs: Sequence[pl.Expr]) -> pl.DataFrame:
    """``df.group_by([*by, last]).agg(aggs)`` for a non-null integer column ``last``, grouped
    on one packed Int64: a group-by on several columns costs two to three times one on a
    single Int64. Returns ``by + [last] + aggs``, in no particular row order."""
    keys = Keys([df], by, [last])
    out = df.group_by(keys.pack(0, last).alias("_k")).agg(aggs)
    return keys.attach_by(
        out.select(keys.group(pl.col("_k")).alias(GROUP), keys.time(pl.col("_k")).alias(last),
                   pl.exclude("_k"))
    )
