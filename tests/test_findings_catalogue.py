"""The finding catalogue: complete, documented, consistent with the rules, docs and schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsysan.findings import CATALOGUE, RULES
from nsysan.findings.baseline import VERDICTS
from nsysan.findings.catalogue import LAYER_TITLES, render_markdown
from nsysan.findings.evidence import OFFENDER_KINDS, UNITS
from nsysan.passes.base import LAYERS, SEVERITIES

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: the symptoms the issue asks the catalogue to cover, and the code that covers each
REQUIRED = {
    "periodic GPU starvation (data pipeline)": "GPU_STARVATION_PERIODIC",
    "unoverlapped H2D": "H2D_NOT_OVERLAPPED",
    "pageable or synchronous copies": "PAGEABLE_OR_SYNC_COPIES",
    "host sync points in the step": "HOST_SYNC_IN_STEP",
    "launch-bound phases": "LAUNCH_BOUND",
    "exposed communication / poor overlap": "EXPOSED_COMMUNICATION",
    "low NCCL bandwidth": "NCCL_LOW_BANDWIDTH",
    "kernels without Tensor Cores": "NO_TENSOR_CORES",
    "a dominant layer": "DOMINANT_LAYER",
    "memory allocation churn": "MEMORY_CHURN",
    "slow start": "SLOW_START",
    "profile without NVTX": "NVTX_MISSING",
    "uncovered GPU time": "NVTX_LOW_COVERAGE",
    "missing tables": "CAPTURE_MISSING_TABLES",
    "CUDA graphs traced without nodes": "CUDA_GRAPH_NO_NODES",
    "unterminated ranges": "NVTX_UNTERMINATED",
    "truncated capture": "CAPTURE_TRUNCATED",
}


def test_every_required_symptom_has_a_code() -> None:
    missing = {s: c for s, c in REQUIRED.items() if c not in CATALOGUE}
    assert not missing


def test_every_rule_is_catalogued_and_every_code_has_a_rule() -> None:
    assert set(RULES) == {c for c, s in CATALOGUE.items() if s.emitted_by == "diagnose"}
    assert {s.emitted_by for s in CATALOGUE.values()} == {"diagnose", "multirank"}


def test_codes_emitted_anywhere_in_nsysan_are_catalogued() -> None:
    """Every `Finding(code="...")` literal in the package names a catalogue code."""
    import re

    root = Path(__file__).resolve().parent.parent / "nsysan"
    used = {m for p in root.rglob("*.py")
            for m in re.findall(r'code="([A-Z][A-Z0-9_]+)"', p.read_text(encoding="utf-8"))}
    assert used and used <= set(CATALOGUE), used - set(CATALOGUE)


@pytest.mark.parametrize("code", sorted(CATALOGUE))
def test_entry_is_complete(code: str) -> None:
    s = CATALOGUE[code]
    assert s.code == code and code.isupper()
    assert s.layer in LAYERS and s.layer in LAYER_TITLES
    for text in (s.title, s.severity_rule, s.advice, s.quick_check, s.nothing_found):
        assert text.strip() and "  " not in text, (code, text)
    # the severity rule names the levels it can produce
    assert any(level in s.severity_rule for level in SEVERITIES), code


def test_docs_page_is_generated_from_the_catalogue() -> None:
    page = (DOCS / "findings.md").read_text(encoding="utf-8")
    assert page == render_markdown(), (
        "docs/findings.md is stale: run `python -m nsysan.findings.catalogue > docs/findings.md`"
    )
    for code in CATALOGUE:
        assert f"`{code}`" in page


def test_json_schema_enums_match_the_code() -> None:
    schema = json.loads((DOCS / "findings-schema.json").read_text(encoding="utf-8"))
    defs = schema["$defs"]
    finding = defs["finding"]["properties"]
    assert finding["layer"]["enum"] == list(LAYERS)
    assert finding["severity"]["enum"] == list(SEVERITIES)
    assert defs["unit"]["enum"] == list(UNITS)
    offender = defs["evidence"]["properties"]["offenders"]["items"]["properties"]
    assert offender["kind"]["enum"] == list(OFFENDER_KINDS)
    assert schema["properties"]["verdict"]["properties"]["label"]["enum"] == list(VERDICTS)
    assert schema["properties"]["schema_version"]["const"] == "1"
