"""`diagnose`: pass results + canonical frames -> baseline, verdict and findings.

Pure: it reads the pass tables and the trace's frames and writes nothing. Each rule is a
function ``Context -> list[Finding]`` that raises `NotEvaluated` when its inputs are missing,
so a missing pass shows up as "not evaluated: <reason>", never as a silent zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from nsysan.errors import ConfigError
from nsysan.findings import (
    judgement,
    rules_capture,
    rules_host,
    rules_idle,
    rules_memory,
    rules_startup,
    rules_work,
)
from nsysan.findings.baseline import Baseline, Verdict, compute_baseline, compute_verdict
from nsysan.findings.catalogue import CATALOGUE
from nsysan.findings.context import Context, NotApplicable, NotEvaluated
from nsysan.findings.evidence import normalise
from nsysan.findings.params import FindingParams
from nsysan.frames.heap import trim
from nsysan.frames.trace import Trace
from nsysan.passes.base import LAYERS, SEVERITIES, Finding, PassResult
from nsysan.passes.schedule import analysis_context

Rule = Callable[[Context], list[Finding]]

#: code -> rule, in the report's order (baseline method: idle first, then communication,
#: kernels, then capture quality).
RULES: dict[str, Rule] = {
    "GPU_STARVATION_PERIODIC": rules_idle.starvation,
    "H2D_NOT_OVERLAPPED": rules_idle.h2d_not_overlapped,
    "PAGEABLE_OR_SYNC_COPIES": rules_idle.pageable_or_sync_copies,
    "HOST_SYNC_IN_STEP": rules_idle.host_sync,
    "LAUNCH_BOUND": rules_idle.launch_bound,
    "EXPOSED_COMMUNICATION": rules_work.exposed_communication,
    "NCCL_LOW_BANDWIDTH": rules_work.nccl_bandwidth,
    "NO_TENSOR_CORES": rules_work.no_tensor_cores,
    "DOMINANT_LAYER": rules_work.dominant_layer,
    "MEMORY_CHURN": rules_memory.with_event_evidence(rules_work.memory_churn),
    # device memory: only when the memory pass ran (NotApplicable otherwise)
    "MEMORY_NEAR_OOM": rules_memory.near_oom,
    "MEMORY_GROWTH": rules_memory.growth,
    "POOL_FRAGMENTATION": rules_memory.pool_fragmentation,
    # host evidence: only when the host pass ran (see OPTIONAL_RULES)
    "HOST_CPU_BOUND": rules_host.cpu_bound,
    "HOST_WAITS_ON_GPU": rules_host.waits_on_gpu,
    "CPU_CONTENTION": rules_host.contention,
    "SLOW_START": rules_work.slow_start,
    "STARTUP_COST": rules_startup.startup_cost,
    "NVTX_MISSING": rules_capture.nvtx_missing,
    "NVTX_LOW_COVERAGE": rules_capture.nvtx_low_coverage,
    "CAPTURE_MISSING_TABLES": rules_capture.missing_tables,
    "CUDA_GRAPH_NO_NODES": rules_capture.graphs_without_nodes,
    "NVTX_UNTERMINATED": rules_capture.nvtx_unterminated,
    "CAPTURE_TRUNCATED": rules_capture.truncated,
    # last: it reads the data-quality counts of every frame the rules before it loaded
    "CAPTURE_DATA_QUALITY": rules_capture.data_quality,
}


#: code -> the pass whose results it reads: the rule runs only when that pass was selected
#: (analyses without it keep exactly their findings, "not evaluated" list included)
OPTIONAL_RULES: dict[str, str] = {code: "host" for code in rules_host.HOST_CODES}


@dataclass
class Diagnosis:
    """What `diagnose` concluded about one trace."""

    trace_id: str
    baseline: Baseline
    verdict: Verdict
    findings: list[Finding]  # most severe first
    not_found: list[str]  # codes whose rule ran and did not fire
    unavailable: list[str]  # codes whose rule could not run
    reasons: dict[str, str] = field(default_factory=dict)  # unavailable code -> why
    params: FindingParams = field(default_factory=FindingParams)

    def worst(self) -> str | None:
        """The highest severity among the findings, or None."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=SEVERITIES.index)

    def codes(self, min_severity: str = "info") -> list[str]:
        """Codes of findings at or above ``min_severity``."""
        lo = SEVERITIES.index(min_severity)
        return [f.code for f in self.findings if SEVERITIES.index(f.severity) >= lo]

    def attribution_note(self) -> str | None:
        """Why per-layer attribution is unavailable, or None when it is available."""
        for f in self.findings:
            if f.code == "NVTX_MISSING":
                return f.message
        if "DOMINANT_LAYER" in self.unavailable:
            return f"Per-layer attribution is unavailable: {self.reasons['DOMINANT_LAYER']}."
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "baseline": self.baseline.to_dict(),
            "verdict": self.verdict.to_dict(),
            "findings": [finding_dict(f) for f in self.findings],
            "not_found": [{"code": c, "sentence": CATALOGUE[c].nothing_found}
                          for c in self.not_found],
            "not_evaluated": [{"code": c, "reason": self.reasons.get(c, "")}
                              for c in self.unavailable],
            "params": asdict(self.params),
        }


def finding_dict(f: Finding) -> dict[str, Any]:
    d = asdict(f)
    spec = CATALOGUE.get(f.code)
    d["advice"] = spec.advice if spec else None
    d["quick_check"] = spec.quick_check if spec else None
    return d


def _sort_key(f: Finding) -> tuple[int, int, str]:
    codes = list(RULES)
    return (-SEVERITIES.index(f.severity),
            codes.index(f.code) if f.code in codes else len(codes), f.code)


def diagnose(
    trace: Trace,
    results: Mapping[str, PassResult],
    *,
    params: FindingParams | None = None,
    samples_per_step: float | None = None,
    tokens_per_step: float | None = None,
) -> Diagnosis:
    """Run every catalogue rule on one trace's pass results.

    Findings emitted by the passes themselves are kept when their code is not one that the
    rules produce (so nothing is reported twice).
    """
    for name, v in (("samples_per_step", samples_per_step), ("tokens_per_step", tokens_per_step)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"--{name.replace('_', '-')} must be positive and finite, "
                              f"got {v!r}")
    # the rules share the products of the analysis (unions, launch links) with the passes:
    # through its context, or one of their own when called on a plain trace
    with analysis_context(trace) as shared:
        ctx = Context(shared, results, params or FindingParams())
        findings: list[Finding] = []
        not_found: list[str] = []
        unavailable: list[str] = []
        reasons: dict[str, str] = {}
        for code, rule in RULES.items():
            if code in OPTIONAL_RULES and OPTIONAL_RULES[code] not in results:
                continue
            try:
                out = rule(ctx)
            except NotEvaluated as exc:
                unavailable.append(code)
                reasons[code] = str(exc)
                continue
            except NotApplicable:  # an optional capture the trace lacks: not reported at all
                continue
            finally:
                trim()  # the C heap's share of the rule's intermediates (`nsysan.frames.heap`)
            if out:
                findings.extend(out)
            else:
                not_found.append(code)
        produced = {f.code for f in findings} | set(RULES)
        for r in results.values():
            findings.extend(replace(f, evidence=normalise(f.evidence)) for f in r.findings
                            if f.code not in produced and f.layer in LAYERS
                            and f.severity in SEVERITIES)
        act = judgement.activity(ctx)
        findings = judgement.cap(ctx, act, findings)
        findings.sort(key=_sort_key)
        return Diagnosis(
            trace_id=trace.trace_id,
            baseline=compute_baseline(ctx, samples_per_step, tokens_per_step),
            verdict=rules_host.with_host_evidence(
                compute_verdict(ctx, findings, judgement.insufficient(ctx, act)), findings),
            findings=findings,
            not_found=not_found,
            unavailable=unavailable,
            reasons=reasons,
            params=ctx.params,
        )
