"""Reports of ``nsysan check`` for CI: JUnit XML (one test case per rule) and a GitHub-style
step-summary in Markdown.

JUnit mapping: a rule that holds is a passing test case, a violated rule a ``<failure>``, a
rule that could not be evaluated (not comparable) an ``<error>`` — CI systems show all three
distinctly. The XML follows the common JUnit schema (``testsuites`` > ``testsuite`` >
``testcase``) understood by Jenkins, GitLab, GitHub test reporters and ``junitparser``.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path

from nsysan.compare.budget import RuleResult, exit_code
from nsysan.report.targets import append_file, write_file

_ICON = {"pass": "✅", "fail": "❌", "not comparable": "⚠️"}


def junit_xml(results: Sequence[RuleResult], *, suite: str, trace_id: str) -> str:
    failures = sum(r.status == "fail" for r in results)
    errors = sum(r.status == "not comparable" for r in results)
    root = ET.Element("testsuites", name="nsysan check", tests=str(len(results)),
                      failures=str(failures), errors=str(errors), time="0")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)),
                       failures=str(failures), errors=str(errors), skipped="0", time="0")
    ET.SubElement(ET.SubElement(ts, "properties"), "property", name="trace_id", value=trace_id)
    for r in results:
        tc = ET.SubElement(ts, "testcase", name=r.rule.name, classname=f"nsysan.budget.{suite}",
                           time="0")
        text = r.line()
        if r.status == "fail":
            el = ET.SubElement(tc, "failure", message=text, type="BudgetViolated")
            el.text = _detail(r)
        elif r.status == "not comparable":
            el = ET.SubElement(tc, "error", message=text, type="NotComparable")
            el.text = _detail(r)
        ET.SubElement(tc, "system-out").text = text
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _detail(r: RuleResult) -> str:
    lines = [f"rule {r.rule.index}: {r.rule.text}"]
    if r.matched:
        lines.append("metrics: " + ", ".join(r.matched))
    if r.reason:
        lines.append(f"reason: {r.reason}")
    return "\n".join(lines)


def step_summary(results: Sequence[RuleResult], *, trace_id: str, budget: str,
                 baseline: str | None) -> str:
    code = exit_code(results)
    n_fail = sum(r.status == "fail" for r in results)
    n_nc = sum(r.status == "not comparable" for r in results)
    head = {0: f"✅ all {len(results)} rules hold",
            3: f"❌ {n_fail} of {len(results)} rules violated",
            4: f"⚠️ {n_nc} of {len(results)} rules not comparable"}[code]
    out = [f"## nsysan check: `{trace_id}` — {head}", "",
           f"Budget `{budget}`" + (f", baseline `{baseline}`" if baseline else "") + ".", "",
           "| | rule | value | limit | note |", "|---|---|---|---|---|"]
    for r in results:
        unit = f" {r.rule.unit_label}" if r.rule.unit_label else ""
        value = "n/a" if r.value is None else f"{r.value:.4g}{unit}"
        limit = "n/a" if r.limit is None else f"{r.rule.op} {r.limit:.4g}{unit}"
        note = r.reason or (f"baseline {r.baseline:.4g}{unit}" if r.baseline is not None else "")
        name, note = (t.replace("|", "\\|") for t in (r.rule.name, note))
        out.append(f"| {_ICON[r.status]} | `{name}` | {value} | {limit} | {note} |")
    return "\n".join(out) + "\n"


def is_junit_report(path: Path) -> bool:
    """``path`` holds a JUnit report of `junit_xml` (which nsysan may replace)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(512)
    except OSError:
        return False
    return b'<testsuites name="nsysan check"' in head


def write_junit(path: str | Path, results: Sequence[RuleResult], *, suite: str,
                trace_id: str, inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Write the JUnit report to ``path``; a file already there is replaced only when it is
    empty or an nsysan JUnit report, and never when it is one of ``inputs``."""
    return write_file(path, junit_xml(results, suite=suite, trace_id=trace_id), inputs=inputs,
                      option="--junit", is_ours=is_junit_report)


def append_summary(path: str | Path, text: str, *,
                   inputs: Iterable[str | os.PathLike[str]] = (),
                   option: str = "--summary") -> Path:
    """Append (GitHub's $GITHUB_STEP_SUMMARY is shared by every step of a job)."""
    return append_file(path, text + "\n", inputs=inputs, option=option)
