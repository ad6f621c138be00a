"""Passes are discovered (issue 17): adding a pass is adding one module with a ``SPEC``; and
every registered pass honours its declared output schemas on an empty trace, a one-op trace
and a shared trace."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from test_gaps import K, build

from nsysan.api import analyze, analyze_to_dir
from nsysan.errors import ConfigError
from nsysan.frames.trace import Trace
from nsysan.passes import registry
from nsysan.passes.schedule import run_passes

_THROWAWAY = '''
"""A pass that exists only in a test: its schema and SPEC are all it takes."""
from dataclasses import dataclass

import polars as pl

from nsysan.passes.base import PassResult, PassSpec

OPS_PER_DEVICE = pl.Schema({"trace_id": pl.String, "device_id": pl.Int64, "n_ops": pl.UInt32})


@dataclass(frozen=True)
class Params:
    pass


def run(trace, params, results):
    table = (trace.frame("gpu_ops").group_by("device_id").agg(pl.len().alias("n_ops"))
             .sort("device_id").select(pl.lit(trace.trace_id).alias("trace_id"), pl.all()))
    steps = results.get("steps")
    return PassResult(tables={"ops_per_device": table},
                      metrics={"saw_steps": steps is not None})


SPEC = PassSpec(name="ops_per_device", description="GPU ops per device (test)",
                params=Params,
                tables={"ops_per_device": OPS_PER_DEVICE}, run=run, after=("steps",),
                default=DEFAULT)
'''


def _package(root: Path, name: str, default: bool) -> str:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ops_per_device.py").write_text(textwrap.dedent(_THROWAWAY).replace(
        "DEFAULT", repr(default)))
    (pkg / "helper.py").write_text("X = 1\n")  # no SPEC: not a pass
    return name


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    names: list[str] = []

    def register(default: bool) -> str:
        name = _package(tmp_path, f"extra_passes_{int(default)}", default)
        names.append(name)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(registry, "PASS_PACKAGES", (*registry.PASS_PACKAGES, name))
        return name

    yield register
    for mod in [m for m in sys.modules if m.split(".")[0] in names]:
        del sys.modules[mod]  # the next test's package of that name lies elsewhere


def _trace() -> Trace:
    return build([K(1, 2), K(3, 4, dev=1), K(5, 6)])


def test_a_new_pass_is_one_module(throwaway, tmp_path):
    throwaway(default=False)
    specs = registry.registry()
    assert "ops_per_device" in specs and "helper" not in specs
    assert "ops_per_device" not in registry.default_passes()  # not default unless it says
    spec = specs["ops_per_device"]
    assert registry.build_params([spec], None)["ops_per_device"] is not None
    result, folder = analyze_to_dir(_trace(), tmp_path / "out",
                                    passes=["steps", "ops_per_device"])
    written = pl.read_parquet(folder / "ops_per_device.parquet")
    assert written.schema == spec.tables["ops_per_device"]
    assert written["n_ops"].to_list() == [2, 1]
    assert result.metrics["ops_per_device.saw_steps"] is True
    assert [p["name"] for p in registry.describe()][-1] == "ops_per_device"


def test_a_new_default_pass_runs_without_being_named(throwaway):
    throwaway(default=True)
    assert registry.default_passes()[-1] == "ops_per_device"
    result = analyze(_trace(), findings=False)
    assert "ops_per_device" in result.tables
    # it declared ``after=("steps",)``: steps ran first and was handed over
    assert list(result.results).index("steps") < list(result.results).index("ops_per_device")


def test_two_passes_of_one_name_are_refused(throwaway, monkeypatch):
    name = throwaway(default=False)
    monkeypatch.setattr(registry, "PASS_PACKAGES", (*registry.PASS_PACKAGES, name, name))
    assert "ops_per_device" in registry.registry()  # one package listed twice: one pass
    monkeypatch.setattr(sys.modules[f"{name}.ops_per_device"], "SPEC",
                        registry.registry()["steps"])
    with pytest.raises(ConfigError, match="two passes are named 'steps'"):
        registry.registry()


def test_the_first_passes_keep_their_order_and_defaults():
    assert list(registry.registry())[:6] == list(registry.TIE_BREAK)
    # the first passes run by default, in their old order; later default passes follow them
    assert registry.DEFAULT_PASSES[:6] == registry.TIE_BREAK
    assert "host" in registry.DEFAULT_PASSES


# ---------------------------------------------------------------------------------------------
# Contract: every registered pass writes exactly its declared tables and schemas
# ---------------------------------------------------------------------------------------------
def _check_contract(trace: Trace) -> None:
    specs = registry.registry()
    for name, spec in specs.items():
        chosen = registry.resolve([name])
        results, _ = run_passes(chosen, trace, registry.build_params(chosen, None))
        got = results[name].tables
        assert set(got) == set(spec.tables), name
        for table, schema in spec.tables.items():
            assert got[table].schema == schema, (name, table)


def test_every_pass_keeps_its_contract_on_an_empty_trace():
    _check_contract(build([]))


def test_every_pass_keeps_its_contract_on_a_one_op_trace():
    _check_contract(build([K(1, 2)]))


def test_every_pass_keeps_its_contract_on_a_shared_trace(shared_traces):
    from nsysan.load import open_trace

    path = shared_traces / "sc22-ddp-4gpu-nccl" / "4gpu_baseline.qdrep.nsys2022.4.2.sqlite"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    _check_contract(open_trace(path))


def test_params_as_strings_typed_values_or_objects_agree():
    from nsysan.passes.gaps import GapsParams

    specs = registry.resolve(["gaps"])
    as_text = registry.build_params(specs, {"gaps.min_gap_ns": "500000"})["gaps"]
    typed = registry.build_params(specs, {"gaps.min_gap_ns": 500000})["gaps"]
    whole = registry.build_params(specs, {"gaps": GapsParams(min_gap_ns=500000)})["gaps"]
    assert as_text == typed == whole == GapsParams(min_gap_ns=500000)
    # a field set on top of a whole object wins over the object's value
    both = registry.build_params(specs, {"gaps": GapsParams(min_gap_ns=1),
                                         "gaps.min_gap_ns": "7"})["gaps"]
    assert both.min_gap_ns == 7
    with pytest.raises(ConfigError, match=r"expected PASS\.PARAM=VALUE"):
        registry.build_params(specs, {"gaps": "not a params object"})


def test_the_schema_list_of_frames_matches_the_specs():
    """`schemas.OUTPUTS` (frames) names the first passes' tables as their SPECs declare
    them; a pass added later declares its tables in its SPEC only."""
    from nsysan.frames import schemas

    declared = {t: s for spec in registry.registry().values() for t, s in spec.tables.items()}
    assert {t: declared[t] for t in schemas.OUTPUTS} == dict(schemas.OUTPUTS)


def test_released_frames_and_freed_products_exist():
    import importlib
    import pkgutil

    import nsysan.passes
    from nsysan.frames import schemas
    from nsysan.frames.context import Product
    from nsysan.frames.schemas_host import HOST_EVIDENCE

    products = set()
    for info in pkgutil.iter_modules(nsysan.passes.__path__):
        mod = importlib.import_module(f"nsysan.passes.{info.name}")
        products |= {v.name for v in vars(mod).values() if isinstance(v, Product)}
    frames = set(schemas.CANONICAL) | set(HOST_EVIDENCE)
    for spec in registry.registry().values():
        assert set(spec.releases) <= frames, spec.name
        assert set(spec.frees) <= products, spec.name
