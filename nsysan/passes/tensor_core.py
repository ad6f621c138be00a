"""Does a kernel use Tensor Cores? A versioned taxonomy of kernel names (sm70 to sm100).

Nsight Systems traces say nothing about the instructions a kernel ran (only GPU-metrics
sampling does), so like PyProf and DLProf nsysan decides from the kernel *name*. The names
libraries give their kernels encode the math: cuBLAS / cuDNN legacy names carry the MMA shape
(``h884``, ``s1688``, ``h16816``), xmma / CUTLASS names say ``tensorop``, ``hmma``,
``tensor16x8x16``, Hopper and Blackwell names say ``gmma`` / ``wgmma`` / ``umma`` /
``tcgen05``, cuBLASLt's Hopper+ kernels are ``nvjet_*``; FP32 SIMT paths say ``sgemm``,
``scudnn``, ``ffma`` or ``simt``.

Each rule is ``(regex, verdict, rule name, note)``; the **first** matching rule wins, so
helpers and explicit negatives come before the broad positives (a cuDNN helper kernel carries
``hmma`` in its template arguments but does no MMA). ``verdict`` is ``True`` (uses Tensor
Cores), ``False`` (does not) or ``None`` (known kernel family, undecidable by name). A name no
rule matches is unknown: ``tensor_core`` is null and ``tensor_core_rule`` is null.

Rules whose name starts with ``simt_`` are matrix-multiply / convolution kernels that run
without Tensor Cores: the ``NO_TENSOR_CORES`` finding reads them (`MATMUL_WITHOUT_TC_RULES`).

Bump `TAXONOMY_VERSION` whenever a rule changes: it is recorded with every result.
Regexes use the Rust ``regex`` syntax of polars (no look-around); matching is on the demangled
name (templated kernels keep the interesting part in their template arguments), falling back to
the short name.
"""

from __future__ import annotations

import polars as pl

TAXONOMY_VERSION = "1.0"

#: (regex, verdict, rule name, note). Order matters: the first match wins.
TAXONOMY: tuple[tuple[str, bool | None, str, str], ...] = (
    # --- helpers of MMA kernels: their templates mention hmma, they do no MMA themselves ---
    (r"::kernel_helper_stage_\d", None, "xmma_helper",
     "index/setup stage of a cuDNN strided dgrad; its math is unknown"),
    (r"computeOffsetsKernel", False, "cudnn_offsets", "cuDNN implicit-gemm offset helper"),
    (r"splitKreduce_kernel", False, "splitk_reduce", "cuBLAS split-K reduction (FP32 adds)"),
    (r"xmma_cudnn::gemm::split_k_kernel<", None, "xmma_split_k",
     "xmma split-K pass; may be the reduction only"),
    # --- explicit SIMT negatives that could otherwise match an xmma / cutlass positive ---
    (r"_ffma_|(?i:OpClassSimt)|cutlass_simt_|cutlass_\d+_simt_|_simt_", False,
     "simt_cutlass_xmma", "CUTLASS / xmma FP32 FMA (SIMT) variant"),
    (r"fmha_cutlass[FB]_f32_\w*_sm(50|70|75)\b", False, "simt_fmha_f32",
     "PyTorch mem-efficient attention, FP32 before sm80: SIMT"),
    (r"fmha_cutlass[FB]_\w*_sm50\b", False, "simt_fmha_sm50", "no Tensor Cores before sm70"),
    # --- Hopper / Blackwell MMA ---
    (r"(?i:wgmma)|Gmma|GMMA|[_:]gmma|Umma|UMMA|tcgen05|SM90_\d+x\d+x\d+_|SM100_MMA", True,
     "sm90_sm100_mma", "warpgroup / UMMA instructions (sm90 wgmma, sm100 tcgen05)"),
    # --- Volta .. Ada MMA markers ---
    (r"(?i)(^|[^a-z])(hmma|imma|dmma|qmma|wmma)", True, "mma_instruction",
     "xmma / cuDNN traits naming the MMA instruction (hmma fp16/bf16/tf32, imma int8)"),
    (r"(?i)tensorop|OpClassTensorOp|tensor_?core", True, "tensorop",
     "CUTLASS TensorOp kernels (cutlass_80_tensorop_*, OpClassTensorOp)"),
    (r"_tensor\d+x\d+x\d+", True, "xmma_tensor_shape",
     "xmma / cuDNN / TensorRT names with the MMA shape (tensor16x8x16)"),
    (r"sm(7\d|8\d|9\d|1\d\d)_xmma_(gemm|fprop|dgrad|wgrad|conv)", True, "xmma_gemm_conv",
     "xmma GEMM / convolution for sm70+ (FP32 FMA variants are caught above)"),
    (r"sm[1-6]\d_xmma_", False, "pre_volta_xmma",
     "xmma kernels for sm50/sm60 (pooling, etc.): no Tensor Cores"),
    (r"(884|1688|1684|16816|16832|8816|8832)(gemm|cudnn|fprop|dgrad|wgrad|conv)", True,
     "mma_shape_gemm", "Volta/Turing/Ampere cuBLAS & cuDNN: h884gemm, s1688gemm, h16816gemm"),
    (r"(^|[^a-z])nvjet_", True, "cublaslt_nvjet", "cuBLASLt Hopper/Blackwell GEMMs"),
    (r"(?i)flash_(fwd|bwd)|flash::|FlashAttn|fmha_cutlass[FB]_|_sdpa_|fmha_", True,
     "flash_attention", "fused attention (FlashAttention, mem-efficient, cuDNN SDPA)"),
    # --- matrix kernels without Tensor Cores ---
    (r"(?i)(^|[^a-z])sgemm|scudnn|convolve_sgemm|gemmSN_|gemmk1_kernel", False, "simt_gemm_conv",
     "FP32 SIMT GEMM / convolution (ampere_sgemm_*, *_scudnn_*, cuDNN implicit sgemm)"),
    (r"(?i)gemv", False, "simt_gemv", "cuBLAS GEMV: memory-bound SIMT"),
    (r"(?i)winograd", False, "simt_winograd", "cuDNN Winograd FP32 convolution stages"),
    (r"_float_engine<|(^|[^a-z])fft\d?d_[rc]2[rc]", False, "simt_conv_engine",
     "cuDNN FP32 convolution engines (convolveNd_dgrad_float_engine) and FFT convolution"),
    # --- non-matrix families ---
    (r"^nccl|ncclKernel|ncclDevKernel", False, "nccl", "NCCL communication kernels"),
)

#: Rules naming matrix-multiply / convolution kernels that run without Tensor Cores.
MATMUL_WITHOUT_TC_RULES: frozenset[str] = frozenset(
    name for _, verdict, name, _ in TAXONOMY if verdict is False and name.startswith("simt_")
)


def rule_table() -> pl.DataFrame:
    """The taxonomy as a frame: ``rule``, ``tensor_core``, ``pattern``, ``note``."""
    return pl.DataFrame(
        {
            "rule": [r[2] for r in TAXONOMY],
            "tensor_core": [r[1] for r in TAXONOMY],
            "pattern": [r[0] for r in TAXONOMY],
            "note": [r[3] for r in TAXONOMY],
        },
        schema={"rule": pl.String, "tensor_core": pl.Boolean, "pattern": pl.String,
                "note": pl.String},
    )


def rule_expr(name: pl.Expr) -> pl.Expr:
    """The name of the first taxonomy rule matching ``name`` (null when none does)."""
    expr: pl.Expr = pl.lit(None, dtype=pl.String)
    # Built back to front so that the first rule is the outermost `when`.
    for pattern, _, rule, _ in reversed(TAXONOMY):
        expr = pl.when(name.str.contains(pattern)).then(pl.lit(rule)).otherwise(expr)
    return expr


def classify(names: pl.DataFrame | pl.LazyFrame, name_col: str = "demangled_name",
             fallback_col: str | None = "short_name") -> pl.LazyFrame:
    """Append ``tensor_core`` (Boolean, null = unknown) and ``tensor_core_rule`` to ``names``.

    Each distinct name is matched once (as text, whether the column is String or
    Categorical), so the cost is the number of distinct kernel names.
    """
    lf = names.lazy()
    key = pl.col(name_col)
    if fallback_col:
        key = pl.coalesce(pl.col(name_col), pl.col(fallback_col))
    lf = lf.with_columns(key.alias("_tc_key"))
    verdicts = rule_table().lazy().select(
        pl.col("rule").alias("tensor_core_rule"), "tensor_core"
    )
    distinct = (
        lf.select("_tc_key").unique()
        .with_columns(rule_expr(pl.col("_tc_key").cast(pl.String)).alias("tensor_core_rule"))
        .join(verdicts, on="tensor_core_rule", how="left")
        .select("_tc_key", "tensor_core", "tensor_core_rule")
    )
    return lf.join(
        distinct, on="_tc_key", how="left", nulls_equal=True, maintain_order="left"
    ).drop("_tc_key")


def classify_names(names: list[str]) -> list[tuple[bool | None, str | None]]:
    """``(tensor_core, rule)`` for each name: a convenience for notebooks and tests."""
    df = pl.DataFrame({"demangled_name": names}, schema={"demangled_name": pl.String})
    out = classify(df, fallback_col=None).collect()
    return list(zip(out["tensor_core"].to_list(), out["tensor_core_rule"].to_list(), strict=True))
