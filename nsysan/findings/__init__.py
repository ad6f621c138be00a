"""Findings: the catalogue of diagnoses, the rules that emit them, baseline and verdict.

``diagnose(trace, results)`` turns pass results into a `Diagnosis`; the reports in
`nsysan.report` render it (markdown, JSON, pictures)."""

from nsysan.findings.baseline import Baseline, BaselineItem, Verdict
from nsysan.findings.catalogue import CATALOGUE, FindingSpec
from nsysan.findings.params import FindingParams
from nsysan.findings.rules import RULES, Diagnosis, diagnose

__all__ = [
    "CATALOGUE",
    "RULES",
    "Baseline",
    "BaselineItem",
    "Diagnosis",
    "FindingParams",
    "FindingSpec",
    "Verdict",
    "diagnose",
]
