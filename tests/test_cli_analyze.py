"""`nsysan analyze` and `nsysan passes` through the CLI: outputs, exit codes, errors."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from nsysan.cli import cli
from nsysan.frames import schemas
from nsysan.passes import registry

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "fixtures" / "example_ddp.sqlite"
CPU_ONLY = ROOT / "fixtures" / "cpu_nvtx_osrt.sqlite"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_analyze_writes_every_table_with_its_schema(tmp_path: Path) -> None:
    code, out, err = run("analyze", str(EXAMPLE), "-o", str(tmp_path))
    assert code == 0, err
    target = tmp_path / "example_ddp"
    assert out.strip().endswith(f"-> {target}")
    assert "verdict" in out and "GPU busy" in out
    for spec in registry.resolve(None):
        for name, schema in spec.tables.items():
            df = pl.read_parquet(target / f"{name}.parquet")
            assert df.schema == schema, name
    for name in ("findings.md", "findings.json", "manifest.json"):
        assert (target / name).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dirs left"


def test_analyze_replaces_an_existing_output(tmp_path: Path) -> None:
    assert run("analyze", str(EXAMPLE), "-o", str(tmp_path), "--passes", "gaps")[0] == 0
    assert run("analyze", str(EXAMPLE), "-o", str(tmp_path), "--passes", "kernels")[0] == 0
    target = tmp_path / "example_ddp"
    assert (target / "kernels.parquet").is_file()
    assert not (target / "gaps.parquet").exists()


def test_selected_passes_and_params(tmp_path: Path) -> None:
    code, _, err = run("analyze", str(EXAMPLE), "-o", str(tmp_path), "--passes", "gaps",
                       "--set", "gaps.scopes=device,stream", "--set", "gaps.min_gap_ns=100000")
    assert code == 0, err
    gaps = pl.read_parquet(tmp_path / "example_ddp" / "gaps.parquet")
    assert set(gaps["scope"]) == {"device", "stream"}
    assert gaps["duration_ns"].min() >= 100_000
    manifest = json.loads((tmp_path / "example_ddp" / "manifest.json").read_text())
    assert "100000" in json.dumps(manifest)


def test_fail_on_returns_3_when_a_finding_reaches_the_level(tmp_path: Path) -> None:
    code, out, _ = run("analyze", str(EXAMPLE), "-o", str(tmp_path), "--fail-on", "warning")
    assert code == 3
    assert "findings:" in out
    code, _, _ = run("analyze", str(EXAMPLE), "-o", str(tmp_path / "b"), "--fail-on", "critical")
    assert code in (0, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--passes", "nope"], "unknown pass 'nope'"),
        (["--set", "gaps.nope=1"], "has no parameter 'nope'"),
        (["--set", "gaps.min_gap_ns=abc"], "cannot read 'abc' as int"),
        (["--set", "min_gap_ns"], "expected PASS.PARAM=VALUE"),
        (["--passes", "kernels", "--set", "gaps.min_gap_ns=1"], "is not selected"),
        (["--samples-per-step", "-1"], "must be positive"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    code, _, err = run("analyze", str(EXAMPLE), "-o", str(tmp_path), *args)
    assert code == 1
    assert err.startswith("Error: ") and message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "example_ddp").exists()


def test_trace_without_cuda_is_an_error_and_others_still_run(tmp_path: Path) -> None:
    code, _, err = run("analyze", str(CPU_ONLY), str(EXAMPLE), "-o", str(tmp_path))
    assert code == 1
    assert "no CUDA activity tables" in err and "--trace=cuda" in err
    assert (tmp_path / "example_ddp" / "gaps.parquet").is_file()
    assert not (tmp_path / "cpu_nvtx_osrt").exists()


def test_missing_input(tmp_path: Path) -> None:
    code, _, err = run("analyze", str(tmp_path / "nope.sqlite"), "-o", str(tmp_path / "out"))
    assert code == 1 and err.startswith("Error: ")


def test_passes_lists_the_registry() -> None:
    code, out, _ = run("passes")
    assert code == 0
    for name in registry.DEFAULT_PASSES:
        assert f"{name}:" in out
    code, out, _ = run("passes", "--json")
    info = json.loads(out)
    tables = {t for p in info for t in p["tables"]}
    assert set(schemas.OUTPUTS) <= tables | {"ranks", "collectives"}


def test_job_mode_writes_rank_tables(tmp_path: Path, shared_traces: Path) -> None:
    files = sorted((shared_traces / "gpubootcamp-jacobi-multigpu").glob("*.sqlite"))
    code, out, err = run("analyze", "--job", *map(str, files), "-o", str(tmp_path))
    assert code == 0, err
    assert out.startswith("job ") and "2 ranks" in out
    job_dir = next(tmp_path.glob("job_*"))
    ranks = pl.read_parquet(job_dir / "ranks.parquet")
    assert sorted(ranks["rank"].to_list()) == [3, 7]


def test_error_names_the_input_once(tmp_path: Path) -> None:
    _, _, err = run("analyze", str(CPU_ONLY), "-o", str(tmp_path))
    assert err.count(str(CPU_ONLY)) == 1


def test_output_directory_is_readable_by_others(tmp_path: Path) -> None:
    import os
    import stat

    old = os.umask(0o022)
    try:
        assert run("analyze", str(EXAMPLE), "-o", str(tmp_path), "--passes", "kernels")[0] == 0
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "example_ddp").stat().st_mode)
    assert mode == 0o755  # not mkdtemp's private 0700


def test_python_dash_m_runs_the_cli() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "nsysan", "--version"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "nsysan" in done.stdout


def test_no_cache_is_a_parameter_not_the_environment(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``--no-cache`` reaches every opening as ``frame_cache=False`` and leaves the process
    environment as it was (a library configured through os.environ outlives the command)."""
    import os

    from nsysan.load import cache

    monkeypatch.delenv("NSYSAN_NO_CACHE", raising=False)
    asked: list[bool | None] = []
    real = cache.enabled
    monkeypatch.setattr(cache, "enabled", lambda p, f, fc: asked.append(fc) or real(p, f, fc))
    code, _, err = run("analyze", str(EXAMPLE), "-o", str(tmp_path / "a"), "--no-cache")
    assert code == 0, err
    assert asked and set(asked) == {False}
    assert "NSYSAN_NO_CACHE" not in os.environ
    asked.clear()
    code, _, err = run("analyze", str(EXAMPLE), "-o", str(tmp_path / "b"))
    assert code == 0, err
    assert set(asked) == {None}
