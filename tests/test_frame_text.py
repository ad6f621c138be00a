"""The dictionary-encoded text of the canonical frames (`nsysan.frames.schemas` conventions):
the closed vocabularies the adapters produce fit their Enums, an Enum orders like its text, a
value outside a vocabulary is refused, and `frames.text.per_value` gives what the text
expression gives on every row."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.frames import schemas
from nsysan.frames.text import as_text, per_value
from nsysan.frames.trace import Trace
from nsysan.load import adapters, adapters_gpu, adapters_memory, adapters_nvtx

ENUMS = {
    "GPU_OP_KIND": (schemas.GPU_OP_KIND, schemas.GPU_OP_KINDS),
    "OP_CLASS": (schemas.OP_CLASS, schemas.OP_CLASSES),
    "API_CLASS": (schemas.API_CLASS, schemas.API_CLASSES),
    "API_LAYER": (schemas.API_LAYER, schemas.API_LAYERS),
    "NVTX_STYLE": (schemas.NVTX_STYLE, schemas.NVTX_STYLES),
    "SYNC_TYPE": (schemas.SYNC_TYPE, schemas.SYNC_TYPE_LABELS),
    "MEMORY_OP": (schemas.MEMORY_OP, schemas.MEMORY_OPS),
}


@pytest.mark.parametrize("name", ENUMS)
def test_enums_hold_their_vocabulary_in_lexical_order(name: str) -> None:
    dtype, vocabulary = ENUMS[name]
    assert list(dtype.categories) == sorted(vocabulary)
    values = pl.Series(list(vocabulary)).cast(dtype)
    # sorting, min and max go by the text, as on the String column they replace
    assert values.sort().to_list() == sorted(vocabulary)
    assert values.max() == max(vocabulary) and values.min() == min(vocabulary)


def test_the_adapters_labels_are_the_closed_vocabularies() -> None:
    # every label an adapter can write (the Enum cast would raise on any other)
    assert tuple(adapters_gpu._OP_KINDS) == schemas.GPU_OP_KINDS
    assert {c for _, c in adapters.COPY_KINDS.values()} | {"compute", "nccl", "memset"} \
        == set(schemas.OP_CLASSES)
    assert {c for c, _ in adapters.API_CLASS_RULES} | {"other"} == set(schemas.API_CLASSES)
    assert set(adapters_nvtx.STYLE_OF_EVENT_TYPE.values()) == set(schemas.NVTX_STYLES)
    assert set(adapters.SYNC_TYPES.values()) | {c for c, _ in adapters.SYNC_TYPE_BY_API} \
        | {"unknown"} == set(schemas.SYNC_TYPE_LABELS)
    assert set(adapters_memory.OPERATIONS.values()) == set(schemas.MEMORY_OPS)


def test_an_op_class_outside_the_vocabulary_is_refused() -> None:
    ops = pl.DataFrame({"start_ns": [1], "end_ns": [2], "op_class": ["weird"]})
    with pytest.raises(pl.exceptions.InvalidOperationError):
        Trace.from_frames("t", {"gpu_ops": ops})
    tr = Trace.from_frames("t", {"gpu_ops": ops.with_columns(pl.lit("nccl").alias("op_class"))})
    assert tr.gpu_ops.schema == schemas.GPU_OPS


NAMES = st.lists(st.sampled_from(["ncclKernel_AllReduce", "sgemm", "Step 3", "step 12", "",
                                  "ÄÖ", None]), max_size=25)
EXPRS = [
    pl.col("name").str.contains(r"(?i)step \d+"),
    pl.col("name").str.starts_with("nccl").fill_null(False),
    pl.col("name").fill_null("?").str.to_uppercase(),
    pl.col("name").str.len_chars(),
    # Booleans with nulls for some values (not only the null name)
    pl.when(pl.col("name").str.len_chars() > 2).then(pl.col("name").str.starts_with("s")),
    pl.col("name").is_null(),
]


@settings(max_examples=60, deadline=None)
@given(NAMES)
def test_per_value_is_the_expression_on_every_row(names: list[str | None]) -> None:
    text = pl.DataFrame({"name": names}, schema={"name": pl.String})
    for encoded in (text.cast({"name": schemas.CAT}), text):
        for expr in EXPRS:
            want = text.select(expr.alias("v"))["v"]
            got = encoded.select(per_value(encoded, "name", expr).alias("v"))["v"]
            assert got.to_list() == want.to_list()
            # also on a part of the frame (a filter of it)
            part = encoded.head(3)
            assert part.select(per_value(encoded, "name", expr).alias("v"))["v"].to_list() \
                == want.head(3).to_list()


def test_as_text_casts_the_encoded_columns_only() -> None:
    df = pl.DataFrame({"a": ["x"], "b": ["y"], "n": [1]}).with_columns(
        pl.col("a").cast(schemas.CAT), pl.col("b").cast(schemas.NVTX_STYLE.__class__(["y"])))
    assert as_text(df).schema == {"a": pl.String, "b": pl.String, "n": pl.Int64}
    assert as_text(df, "a").schema == {"a": pl.String, "b": df.schema["b"], "n": pl.Int64}
