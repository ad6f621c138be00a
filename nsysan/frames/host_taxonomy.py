"""Which stack layer does a CPU sample's code belong to? A versioned module taxonomy.

nsys' CPU sampling names the module (shared object or executable path) of every frame of a
sample's call stack. nsysan maps the module's *file name* (the part after the last ``/``,
lower-cased) to a host layer; a module no rule matches is ``unknown`` (never guessed).

Host layers (`HOST_LAYERS`), and the stack layer (`nsysan.passes.base.LAYERS`) each counts in:

- ``runtime_driver``: the CUDA driver and runtime (``libcuda``, ``libcudart``, ``libnvrtc``);
- ``communication``: NCCL, MPI and their transports (``libnccl*``, ``libmpi*``, ``libucp``/
  ``libucs``/``libuct``, ``libfabric``, ``libibverbs``, ``libmlx5``, Open MPI's ``libopen-pal``/
  ``libopen-rte``/``mca_*``, ``libpmix``);
- ``operator_library``: ``libcudnn*``, ``libcublas*``, ``libcufft``, ``libcurand``,
  ``libcusparse``, ``libcusolver``, ``libnvinfer`` (TensorRT);
- ``data_pipeline`` (framework layer, input): ``libdali*``, ``libnvjpeg``, ``libjpeg*``/
  ``libturbojpeg``, ``libpng*``, ``libwebp``, ``libtiff``, OpenCV (``cv2*``, ``libopencv*``),
  Pillow (``_imaging*`` and anything under a ``/PIL/`` directory), anything under
  ``/nvidia/dali/`` (DALI's Python bindings), ``libav*`` (ffmpeg);
- ``framework``: ``libtorch*``, ``libc10*``, ``libpython*``, the ``python3.x`` interpreter,
  ``libtensorflow*``/``_pywrap_tensorflow*``, ``libjax*``/``xla_extension*``/``jaxlib``,
  NumPy (``_multiarray_umath*``), anything under ``site-packages/numpy/`` or ``/torch/``;
- ``os``: the C library and loader (``libc``, ``libpthread``, ``libm``, ``librt``, ``libdl``,
  ``ld-linux*``/``ld-2.*``), the C++ and compiler runtimes (``libstdc++``, ``libgcc_s``),
  ``[kernel.kallsyms]`` and ``[vdso]`` (where ``clock_gettime`` lives);
- ``profiler``: nsys' own code in the profiled process (``libToolsInjection*``, ``libcupti*``,
  ``libnvtx*`` injection, anything under an ``NsightSystems`` / ``nsight-systems``
  directory). nsys' own threads (``[NSys]``, ``[NSys Comms]``, ``CUPTI worker thread``) are
  profiler threads whatever they run (`PROFILER_THREAD_PATTERN`).

**A sample's layer** is its leaf frame's, except that OS code runs on behalf of its caller:
when the leaf is ``os``, the sample counts in the layer of the nearest caller frame whose
layer is neither ``os`` nor ``unknown`` (``[vdso]``/``clock_gettime`` polled from
``libcuda`` is a driver wait, a ``read`` under ``libdali_operators`` is data loading); an OS
leaf with no such caller stays ``os``. An ``unknown`` leaf stays ``unknown``.

Bump `TAXONOMY_VERSION` whenever a rule changes: it is recorded with every result.
Regexes use the Rust ``regex`` syntax of polars; the first matching rule wins.
"""

from __future__ import annotations

import numpy as np
import polars as pl

TAXONOMY_VERSION = "1.0"

HOST_LAYERS = (
    "framework",
    "data_pipeline",
    "communication",
    "operator_library",
    "runtime_driver",
    "os",
    "profiler",
    "unknown",
)
#: host layer -> the stack layer of `nsysan.passes.base.LAYERS` it counts in (None: none)
STACK_LAYER_OF: dict[str, str | None] = {
    "framework": "framework",
    "data_pipeline": "framework",
    "communication": "communication",
    "operator_library": "operator_library",
    "runtime_driver": "runtime_driver",
    "os": None,
    "profiler": "capture",
    "unknown": None,
}

#: (regex on the lower-cased file name, or on the whole path for rules marked path, layer,
#: rule name). Order matters: the first match wins.
TAXONOMY: tuple[tuple[str, bool, str, str], ...] = (
    # profiler first: nsys ships its own libcupti, matched by directory too
    (r"(^|/)(nsightsystems|nsight-systems|nsight_systems)[^/]*/", True, "profiler",
     "nsys_install_dir"),
    (r"^(libtoolsinjection|libcupti|libnvtx\d*_?injection|libnsys)", False, "profiler",
     "nsys_injection"),
    (r"^(libcuda\.so|libcuda-|libcudart|libnvrtc|libnvidia-ptxjitcompiler|libcudadebugger)",
     False, "runtime_driver", "cuda_driver_runtime"),
    (r"^(libnccl|libmpi|libucp|libucs|libuct|libucm|libfabric|libibverbs|libmlx\d|librdmacm"
     r"|libopen-pal|libopen-rte|mca_|libpmix|libpsm|libhcoll|libsharp|libgloo)",
     False, "communication", "communication_libs"),
    (r"^(libcudnn|libcublas|libcufft|libcurand|libcusparse|libcusolver|libnvinfer|libcutensor"
     r"|libnvblas)", False, "operator_library", "math_libs"),
    (r"(^|/)pil/|/nvidia/dali/", True, "data_pipeline", "pillow_dali_dir"),
    (r"/(site|dist)-packages/(numpy|torch)/", True, "framework", "numpy_torch_dir"),
    (r"^(libdali|libnvjpeg|libjpeg|libturbojpeg|libpng|libwebp|libtiff|cv2|libopencv|_imaging"
     r"|libavcodec|libavformat|libavutil|libswscale)", False, "data_pipeline",
     "input_pipeline_libs"),
    (r"^(libtorch|libc10|libpython\d|python\d(\.\d+)?$|libtensorflow|_pywrap_tensorflow"
     r"|libjax|xla_extension|libshm\.so|_multiarray_umath|libtorch_python)", False,
     "framework", "framework_libs"),
    (r"^(libc\.so|libc-\d|libpthread|libm\.so|libm-\d|librt|libdl|ld-linux|ld-\d|libstdc\+\+"
     r"|libgcc_s|\[kernel\.kallsyms\]|\[vdso\])", False, "os", "os_libs"),
)
#: names of nsys' own threads in the profiled process
PROFILER_THREAD_PATTERN = r"^(\[NSys|CUPTI worker thread)"


def rule_table() -> pl.DataFrame:
    """The taxonomy as a frame: ``rule``, ``layer``, ``pattern``, ``on_path``."""
    return pl.DataFrame(
        {
            "rule": [r[3] for r in TAXONOMY],
            "layer": [r[2] for r in TAXONOMY],
            "pattern": [r[0] for r in TAXONOMY],
            "on_path": [r[1] for r in TAXONOMY],
        },
        schema={"rule": pl.String, "layer": pl.String, "pattern": pl.String,
                "on_path": pl.Boolean},
    )


def layer_expr(module: pl.Expr) -> pl.Expr:
    """The host layer of the module path ``module`` (``unknown`` when no rule matches or the
    module is null)."""
    path = module.str.to_lowercase()
    name = path.str.replace(r"^.*/", "")
    expr: pl.Expr = pl.lit("unknown")
    for pattern, on_path, layer, _ in reversed(TAXONOMY):
        target = path if on_path else name
        expr = pl.when(target.str.contains(pattern)).then(pl.lit(layer)).otherwise(expr)
    return pl.when(module.is_null()).then(pl.lit("unknown")).otherwise(expr)


def module_layers(modules: pl.Series) -> pl.DataFrame:
    """``module, layer`` for each distinct module of ``modules`` (each matched once)."""
    # ``module`` keeps the input's dtype (String or Categorical) so that it joins back; the
    # rules match on the text of the few distinct values only
    distinct = pl.DataFrame({"module": modules}).unique("module")
    return distinct.with_columns(layer_expr(pl.col("module").cast(pl.String)).alias("layer"))


def _in_stack_order(stacks: pl.DataFrame) -> bool:
    """True when ``stacks`` is sorted by (sample_id, depth), as the cpu_stacks frame is."""
    if stacks.height < 2:
        return True
    key = stacks.select(d_id=pl.col("sample_id").diff(), d_depth=pl.col("depth").diff()).slice(1)
    return bool(key.select(((pl.col("d_id") > 0) | ((pl.col("d_id") == 0)
                                                     & (pl.col("d_depth") >= 0))).all()).item())


def frame_layer_codes(modules: pl.Series) -> pl.Series:
    """The `HOST_LAYERS` index (UInt8) of every frame's module; each distinct module is
    classified once and the codes are gathered through the Categorical's physical ids (no
    hashing of the millions of frames)."""
    cat = modules if modules.dtype == pl.Categorical else modules.cast(pl.Categorical)
    phys = cat.to_physical()
    distinct = pl.DataFrame({"module": cat}).unique("module").with_columns(
        phys=pl.col("module").to_physical(),
        code=layer_expr(pl.col("module").cast(pl.String)).replace_strict(
            {x: i for i, x in enumerate(HOST_LAYERS)}, return_dtype=pl.UInt8),
    ).drop_nulls("phys")
    unknown = HOST_LAYERS.index("unknown")
    size = int(distinct["phys"].max() or 0) + 1
    table = np.full(size, unknown, dtype=np.uint8)
    table[distinct["phys"].to_numpy()] = distinct["code"].to_numpy()
    codes = np.full(cat.len(), unknown, dtype=np.uint8)
    valid = phys.is_not_null().to_numpy()
    codes[valid] = table[phys.filter(phys.is_not_null()).to_numpy()]
    return pl.Series("code", codes)


def sample_layers(stacks: pl.DataFrame) -> pl.DataFrame:
    """``sample_id, leaf_layer, layer`` of every sample of ``stacks`` (``cpu_stacks``
    columns ``sample_id, depth, module``), by the rule of the module docstring."""
    if stacks.is_empty():
        return pl.DataFrame(schema={"sample_id": pl.Int64, "leaf_layer": pl.String,
                                    "layer": pl.String})
    frames = stacks.select("sample_id", "depth").with_columns(
        frame_layer_codes(stacks["module"]))
    if not _in_stack_order(frames):
        frames = frames.sort("sample_id", "depth", maintain_order=True)
    os_code, unknown = HOST_LAYERS.index("os"), HOST_LAYERS.index("unknown")
    # in (sample_id, depth) order a sample's first depth-0 frame follows another sample's
    leaf = (frames.filter(pl.col("depth") == 0).select("sample_id", leaf_code="code")
            .filter(pl.col("sample_id").ne_missing(pl.col("sample_id").shift(1))))
    # the nearest caller with a known, non-OS layer: the first such frame of each sample in
    # (sample_id, depth) order; computed for all samples (a filter and a shift on integer
    # columns), used for the OS leaves only
    known = frames.filter((pl.col("depth") > 0) & (pl.col("code") != os_code)
                          & (pl.col("code") != unknown)).select("sample_id", "code")
    callers = known.filter(
        pl.col("sample_id").ne_missing(pl.col("sample_id").shift(1))
    ).select("sample_id", caller_code="code")
    out = leaf.join(callers, on="sample_id", how="left", maintain_order="left").select(
        "sample_id", "leaf_code",
        code=pl.when(pl.col("leaf_code") == os_code)
        .then(pl.coalesce("caller_code", pl.lit(os_code, dtype=pl.UInt8)))
        .otherwise("leaf_code"),
    )
    names = pl.Series(HOST_LAYERS, dtype=pl.String)
    return pl.DataFrame({
        "sample_id": out["sample_id"],
        "leaf_layer": names.gather(out["leaf_code"]),
        "layer": names.gather(out["code"]),
    })  # in sample_id order: the leaves were
