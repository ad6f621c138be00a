"""Names and bandwidths of NCCL operations, for `nsysan.passes.nccl` (whose module docstring
defines them): the op, algorithm, protocol, reduction and type a kernel name encodes, the op an
NCCL API range issues, and nccl-tests' algorithm and bus bandwidths.
"""

from __future__ import annotations

from typing import TypeVar

import polars as pl

FrameT = TypeVar("FrameT", pl.DataFrame, pl.LazyFrame)

_OPS_ALT = (
    "AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|Send|Recv|AllToAll|AlltoAll"
    "|Gather|Scatter|Generic"
)
#: op right after the prefix: ncclKernel_X, ncclDevKernel_X, or 2.4-era ncclXRingLLKernel
_KERNEL_OP_RE = rf"^nccl(?:Dev)?(?:Kernel)?_?({_OPS_ALT})"
_ALGO_RE = r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)(?:_|$)"
_OLD_ALGO_RE = r"(Ring|Tree|CollNet)(LL128|LL)?Kernel"
_PROTO_RE = r"_(LL128|LL|SIMPLE)(?:_|$)"
_REDOP_RE = r"(?i)_(sum|prod|minmax|min|max|premulsum|sumpostdiv)_([A-Za-z0-9]+(?-i:_t)?)"
_REDOPS = {"sum": "Sum", "prod": "Prod", "minmax": "MinMax", "min": "Min", "max": "Max",
           "premulsum": "PreMulSum", "sumpostdiv": "SumPostDiv"}
#: NCCL API ranges that issue an operation (not ncclGroupStart/End, comm init, ...)
_API_OP_RE = (
    r"^nccl(AllReduce|AllGather|ReduceScatter|Broadcast|Bcast|Reduce|Send|Recv|AllToAll"
    r"|AlltoAll|Gather|Scatter)$"
)
_OP_ALIASES = {"Bcast": "Broadcast", "AlltoAll": "AllToAll"}

#: nccl-tests bus-bandwidth factor kind per op (see the module docstring)
_BUS_FACTOR = {"AllReduce": "2(n-1)/n", "AllGather": "(n-1)/n", "ReduceScatter": "(n-1)/n",
               "AllToAll": "(n-1)/n"}
#: ops whose NVTX message size is per rank: the nccl-tests size is n times it
_SIZE_TIMES_N = ("AllGather", "ReduceScatter")


def _clean(col: str) -> pl.Expr:
    # Short names normally have no signature; demangled ones do ("void f(args)").
    return pl.col(col).str.replace(r"^void\s+", "").str.replace(r"\(.*$", "")


def kernel_fields(col: str = "name") -> list[pl.Expr]:
    """Expressions ``op, algorithm, protocol, redop, dtype`` parsed from a kernel name column
    (null where the name does not say; op is null for non-NCCL names)."""
    name = _clean(col)
    op = name.str.extract(_KERNEL_OP_RE, 1).replace(_OP_ALIASES)
    old_algo = name.str.extract(_OLD_ALGO_RE, 1)
    algo = pl.coalesce(name.str.extract(_ALGO_RE, 1), old_algo.str.to_uppercase())
    proto = pl.coalesce(
        name.str.extract(_PROTO_RE, 1),
        name.str.extract(_OLD_ALGO_RE, 2),
        pl.when(old_algo.is_not_null()).then(pl.lit("SIMPLE")),
    )
    redop = name.str.extract(_REDOP_RE, 1).str.to_lowercase().replace_strict(
        _REDOPS, default=None, return_dtype=pl.String
    )
    dtype = name.str.extract(_REDOP_RE, 2)
    return [
        op.alias("op"), algo.alias("algorithm"), proto.alias("protocol"),
        redop.alias("redop"), dtype.alias("dtype"),
    ]


def parse_kernel_names(names: pl.Series | list[str]) -> pl.DataFrame:
    """``name, op, algorithm, protocol, redop, dtype`` for each kernel name."""
    return pl.DataFrame({"name": pl.Series(names, dtype=pl.String)}).with_columns(
        kernel_fields("name")
    )


def api_op(col: str = "name") -> pl.Expr:
    """The op an NCCL API range name issues (``ncclBcast`` -> Broadcast), else null."""
    return pl.col(col).str.extract(_API_OP_RE, 1).replace(_OP_ALIASES)


def busbw_factor(op: str, n_ranks: int | None) -> float | None:
    """nccl-tests bus-bandwidth factor of ``op`` on ``n_ranks`` ranks (None when n unknown
    for an op that needs it)."""
    kind = _BUS_FACTOR.get(op)
    if kind is None:
        return 1.0
    if not n_ranks or n_ranks < 1:
        return None
    return (2.0 if kind == "2(n-1)/n" else 1.0) * (n_ranks - 1) / n_ranks


def _busbw_factor_expr(op: pl.Expr, n: pl.Expr) -> pl.Expr:
    n = n.cast(pl.Float64)
    expr = pl.lit(1.0)
    for o, kind in _BUS_FACTOR.items():
        scale = 2.0 if kind == "2(n-1)/n" else 1.0
        expr = pl.when(op == o).then(
            pl.when(n >= 1).then(scale * (n - 1) / n)
        ).otherwise(expr)
    return expr


def algbw_expr(op: pl.Expr, nbytes: pl.Expr, n: pl.Expr, dur: pl.Expr) -> pl.Expr:
    """nccl-tests algorithm bandwidth in GB/s (bytes per ns)."""
    size = pl.when(op.is_in(_SIZE_TIMES_N)).then(nbytes * n).otherwise(nbytes)
    return pl.when(dur > 0).then(size.cast(pl.Float64) / dur.cast(pl.Float64))


def with_bandwidth(df: FrameT) -> FrameT:
    """Add ``algbw_gbps`` and ``busbw_gbps`` from ``op, bytes, n_ranks, duration_ns``."""
    op, n = pl.col("op"), pl.col("n_ranks")
    algbw = algbw_expr(op, pl.col("bytes"), n, pl.col("duration_ns"))
    return df.with_columns(algbw.alias("algbw_gbps")).with_columns(
        (pl.col("algbw_gbps") * _busbw_factor_expr(op, n)).alias("busbw_gbps"))
