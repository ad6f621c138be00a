"""Export-form identity: one capture gives the same frames and answers in every export form.

The same run exported by nsys 2022.4.2 (SQLite, schema 3.0.0), by nsys 2023.4.4 (SQLite, schema
3.7.2) and by nsys 2023.4.4 as ``parquetdir`` must load into identical canonical frames and
identical ``analyze`` tables, Parquet files and findings. Frames are compared without
``trace_id`` and after sorting by every column (the key); the only exceptions are rows of the
``meta`` frame where the exporters genuinely record different data, each named below.

What differs between the raw exports (checked table by table; everything else is equal value for
value, nulls included, and StringIds ids are the same in all of them):
- schema 3.7.2 adds ``greenContextId`` to the CUPTI activity tables (null here) and renames
  ``TARGET_INFO_CUDA_NULL_STREAM`` to ``TARGET_INFO_CUDA_CONTEXT_INFO``;
- export metadata: ``EXPORT_META_DATA`` (2022.4) vs ``META_DATA_EXPORT`` (2023.4), with other keys;
- capture settings (``META_DATA_CAPTURE``) exist only in the 2023.4 *SQLite* export: neither
  2022.4 nor the 2023.4.4 parquetdir writes them;
- ``TARGET_INFO_SYSTEM_ENV`` values changed encoding in 2023.4 (JSON and ``;``-separated lists
  where 2022.4 wrote raw protobuf bytes and NUL-separated lists), see `_REENCODED_SYSTEM_KEYS`;
- the 2023.4.4 parquetdir omits ``CUPTI_ACTIVITY_KIND_CUDA_EVENT`` (no frame reads it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from nsysan.frames import schemas

pytestmark = [pytest.mark.shared, pytest.mark.slow]

#: capture -> its export forms; the first is the reference the others are compared with
CAPTURES: dict[str, list[str]] = {
    "sc22": [
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2022.4.2.sqlite",
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys-rep.nsys2023.4.4.sqlite",
        "sc22-ddp-4gpu-nccl/4gpu_baseline.nsys2023.4.4.parquetdir",
    ],
    "mnist": [
        "aiprofiler-pytorch-emit-nvtx/baseline_nvtx.nsys-rep.nsys2022.4.2.sqlite",
        "aiprofiler-pytorch-emit-nvtx/baseline_nvtx.nsys-rep.nsys2023.4.4.sqlite",
    ],
    "vit": [
        "sc23-vit-train-nvtx/4workers.nsys-rep.nsys2023.4.4.sqlite",
        "sc23-vit-train-nvtx/4workers.nsys2023.4.4.parquetdir",
    ],
}


def _form(rel: str) -> str:
    """``sqlite-2022.4.2`` / ``parquetdir-2023.4.4`` from an export's file name."""
    version = rel.split(".nsys")[-1].split(".sqlite")[0].split(".parquetdir")[0]
    return f"{'parquetdir' if rel.endswith('.parquetdir') else 'sqlite'}-{version}"


PAIRS = [
    pytest.param(forms[0], other, id=f"{capture}:{_form(forms[0])}-vs-{_form(other)}")
    for capture, forms in CAPTURES.items()
    for other in forms[1:]
]

# --- documented exceptions (meta frame only) ----------------------------------------------------

#: meta keys that describe the export (which nsys wrote it, when, in which form), not the capture
_EXPORT_KEYS = ("source_format", "exporter_version", "schema_version")
_EXPORT_PREFIX = "export:"
#: capture settings: present only where META_DATA_CAPTURE is (2023.4+ SQLite exports)
_CAPTURE_PREFIX = "capture:"
#: TARGET_INFO_SYSTEM_ENV entries whose encoding nsys 2023.4 changed (protobuf bytes / NUL lists
#: -> JSON / ";" lists); equal whenever the exporter version is equal
_REENCODED_SYSTEM_KEYS = frozenset(
    f"system:{k}"
    for k in (
        "DeviceEnvironment",
        "EventLibSourcesInfo",
        "GpuInfo",
        "GpuMetricsSupportedGpus",
        "LinuxPerfInfo",
        "NicInfo",
        "QnxKernelTraceInfo",
        "SupportedFTraceEvents",
    )
)


def _exporter(rel: str) -> str:
    return _form(rel).split("-", 1)[1]


def _comparable_meta(meta: pl.DataFrame, same_exporter: bool) -> dict[str, str | None]:
    out = {}
    for key, value in meta.select("key", "value").iter_rows():
        if key in _EXPORT_KEYS or key.startswith((_EXPORT_PREFIX, _CAPTURE_PREFIX)):
            continue
        if not same_exporter and key in _REENCODED_SYSTEM_KEYS:
            continue
        out[key] = value
    return out


def _canonical(df: pl.DataFrame) -> pl.DataFrame:
    """Drop trace_id and sort by every column: the comparison key of an unordered frame."""
    df = df.drop("trace_id", strict=False)
    return df.sort(df.columns, nulls_last=True, maintain_order=True) if df.width else df


# --- loading, once per export ---------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(shared_traces: Path) -> Callable[[str], object]:
    from nsysan.load import open_trace

    @cache
    def load(rel: str):
        return open_trace(shared_traces / rel).load_all()

    return load


@pytest.fixture(scope="module")
def analyzed(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory):
    from nsysan.api import analyze, write_outputs

    out_root = tmp_path_factory.mktemp("forms")

    @cache
    def run(rel: str):
        result = analyze(shared_traces / rel)
        out = write_outputs(result, out_root / _form(rel).replace(".", "_"))
        return result, out

    return run


# --- canonical frames ---------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [f for f in schemas.CANONICAL if f != "meta"])
@pytest.mark.parametrize(("ref", "other"), PAIRS)
def test_canonical_frames_identical(loaded, ref: str, other: str, frame: str) -> None:
    a, b = loaded(ref), loaded(other)
    assert a.has(frame) == b.has(frame), f"{frame} captured in one form only"
    assert a.frame(frame).schema == b.frame(frame).schema
    assert_frame_equal(_canonical(a.frame(frame)), _canonical(b.frame(frame)), check_exact=True)


@pytest.mark.parametrize(("ref", "other"), PAIRS)
def test_trace_meta_identical_except_named_exporter_differences(
    loaded, ref: str, other: str
) -> None:
    a, b = loaded(ref), loaded(other)
    same_exporter = _exporter(ref) == _exporter(other)
    assert _comparable_meta(a.meta_frame, same_exporter) == _comparable_meta(
        b.meta_frame, same_exporter
    )
    for field in ("session_start_utc_ns", "duration_ns", "missing"):
        assert getattr(a.meta, field) == getattr(b.meta, field), field
    # the exceptions are real, not a blanket pass: what the export says about itself differs
    assert (a.meta.source_format, a.meta.exporter_version) != (
        b.meta.source_format,
        b.meta.exporter_version,
    )


@pytest.mark.parametrize(
    ("rel", "has_capture_settings"),
    [
        (CAPTURES["sc22"][0], False),  # 2022.4.2 SQLite: no META_DATA_CAPTURE in schema 3.0.0
        (CAPTURES["sc22"][1], True),  # 2023.4.4 SQLite
        (CAPTURES["sc22"][2], False),  # 2023.4.4 parquetdir: the exporter does not write it
        (CAPTURES["vit"][1], False),
    ],
    ids=["sc22-sqlite-2022.4.2", "sc22-sqlite-2023.4.4", "sc22-parquetdir", "vit-parquetdir"],
)
def test_capture_settings_exist_only_in_2023_sqlite_exports(
    loaded, rel: str, has_capture_settings: bool
) -> None:
    """The one documented data gap of the parquetdir form, pinned so a change is noticed."""
    trace = loaded(rel)
    assert bool(trace.meta.capture) == has_capture_settings
    keys = trace.meta_frame["key"]
    assert keys.str.starts_with(_CAPTURE_PREFIX).any() == has_capture_settings


# --- analyze: tables, Parquet files, findings ----------------------------------------------------


@pytest.mark.parametrize(("ref", "other"), PAIRS)
def test_analyze_tables_identical(analyzed, ref: str, other: str) -> None:
    (a, _), (b, _) = analyzed(ref), analyzed(other)
    assert a.tables.keys() == b.tables.keys()
    assert a.tables, "analyze produced no tables"
    for name, table in a.tables.items():
        try:
            # same inputs, same plans: floats are expected bit-identical too
            assert_frame_equal(_canonical(table), _canonical(b.tables[name]), check_exact=True)
        except AssertionError as exc:
            raise AssertionError(f"table {name}: {exc}") from None


@pytest.mark.parametrize(("ref", "other"), PAIRS)
def test_analyze_parquet_outputs_and_findings_identical(analyzed, ref: str, other: str) -> None:
    (_, dir_a), (_, dir_b) = analyzed(ref), analyzed(other)
    files_a = sorted(p.name for p in dir_a.glob("*.parquet"))
    assert files_a, f"no Parquet outputs in {dir_a}"
    assert files_a == sorted(p.name for p in dir_b.glob("*.parquet"))
    for name in files_a:
        got_a, got_b = pl.read_parquet(dir_a / name), pl.read_parquet(dir_b / name)
        try:
            assert_frame_equal(_canonical(got_a), _canonical(got_b), check_exact=True)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    # findings.json: everything but the block that names the input file and its exporter
    fa, fb = (dir_a / "findings.json"), (dir_b / "findings.json")
    if fa.exists() or fb.exists():
        ja, jb = json.loads(fa.read_text()), json.loads(fb.read_text())
        ja.pop("trace", None), jb.pop("trace", None)
        assert ja == jb


@pytest.mark.parametrize(("ref", "other"), [PAIRS[1]])  # sc22: 2022.4.2 SQLite vs parquetdir
def test_cli_diff_across_forms_finds_no_change(shared_traces: Path, ref: str, other: str) -> None:
    """End to end: `nsysan diff` of one run against itself in another export form passes the
    regression gate (exit 3 = a metric regressed, 4 = runs not comparable)."""
    from click.testing import CliRunner

    from nsysan.cli import cli

    args = ["diff", "--fail-on-regression", str(shared_traces / ref), str(shared_traces / other)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
