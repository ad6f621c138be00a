"""`distinct` gives the rows of ``df.unique()`` (order aside), nulls kept apart from values."""

from __future__ import annotations

from unittest import mock

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.passes import distinct as distinct_module
from nsysan.passes.distinct import distinct

ints = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([-(2**62), 2**62]))


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(ints, ints, ints), max_size=40), st.integers(1, 3))
def test_distinct_is_unique(rows: list[tuple[int | None, ...]], n_cols: int) -> None:
    names = ["pid", "device_id", "global_tid"][:n_cols]
    df = pl.DataFrame([r[:n_cols] for r in rows], schema={n: pl.Int64 for n in names},
                      orient="row")
    got = distinct(df)
    assert got.schema == df.schema
    assert _sorted(got).equals(_sorted(df.unique()))


int32s = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from([-(2**31), 2**31 - 1]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(int32s, int32s, ints), max_size=40))
def test_distinct_of_narrow_and_wide_columns_is_unique(
    rows: list[tuple[int | None, ...]],
) -> None:
    # the frames' Int32 ids beside Int64 global ids: codes built in one Int64 array
    schema = {"device_id": pl.Int32, "stream_id": pl.Int32, "global_tid": pl.Int64}
    df = pl.DataFrame(rows, schema=schema, orient="row")
    got = distinct(df)
    assert got.schema == df.schema
    assert _sorted(got).equals(_sorted(df.unique()))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(int32s, ints), max_size=60), st.integers(1, 7), st.integers(0, 4))
def test_distinct_by_chunks_is_unique(rows: list[tuple[int | None, ...]], chunk: int,
                                      few: int) -> None:
    """Chunks of ``chunk`` rows, the whole frame at once when the first chunk has more than
    ``few`` distinct rows: the rows of ``df.unique()`` either way."""
    df = pl.DataFrame(rows, schema={"pid": pl.Int32, "global_tid": pl.Int64}, orient="row")
    with mock.patch.multiple(distinct_module, CHUNK=chunk, FEW=few):
        got = distinct(df)
    assert got.schema == df.schema
    assert _sorted(got).equals(_sorted(df.unique()))
