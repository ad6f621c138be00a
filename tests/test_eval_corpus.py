"""The evaluation corpus (tests/eval/labels): every label holds, and every finding code has a
positive and a negative label. A label for a new code is a new file: nothing here lists codes
or files."""

from __future__ import annotations

from pathlib import Path

import pytest

from nsysan.errors import ConfigError
from nsysan.findings.catalogue import CATALOGUE
from nsysan.testing import eval as ev
from tests.conftest import unavailable

LABELS = ev.load_labels()


@pytest.mark.parametrize("label", LABELS, ids=[lb.name for lb in LABELS])
def test_label_holds(label: ev.Label, tmp_path: Path) -> None:
    result = ev.run_label(label, tmp_path)
    if result.skipped:
        unavailable(result.skipped)
    assert not result.failures, "\n".join(
        f"{c.kind} {c.code}: {c.detail}" for c in result.failures)


def test_every_catalogue_code_has_a_positive_and_a_negative_label() -> None:
    positive = {e.code for lb in LABELS for e in lb.expect}
    negative = {f.code for lb in LABELS for f in lb.forbid if not f.implicit}
    assert not set(CATALOGUE) - positive, "codes without a label that expects them"
    assert not set(CATALOGUE) - negative, "codes without a label that forbids them"


def test_healthy_negatives_cover_the_issue_kinds() -> None:
    """A well-overlapped run, steady compute with ~1% dispatch idle, a tiny smoke trace."""
    healthy = {lb.name for lb in LABELS
               if any(f.implicit and f.max_severity == "info" for f in lb.forbid)}
    assert {"healthy", "compute_steady", "tiny_first_launch"} <= healthy


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "x.toml"
    p.write_text(text, encoding="utf-8")
    return p


_TRACE = '[trace]\nbuilder = "nsysan.testing.eval_traces:microbench"\nderivation = "planted"\n'


@pytest.mark.parametrize(("body", "message"), [
    ('[trace]\nbuilder = "m:f"\n', "derivation is required"),
    ('[trace]\nderivation = "d"\n', "exactly one of builder, shared, fixture"),
    (_TRACE + '[[expect]]\ncode = "NO_SUCH_CODE"\n', "unknown finding code"),
    (_TRACE + '[[expect]]\ncode = "LAUNCH_BOUND"\nmin_severity = "high"\n', "min_severity"),
    (_TRACE + '[[expect]]\ncode = "LAUNCH_BOUND"\n[[forbid]]\ncode = "LAUNCH_BOUND"\n',
     "both expected and forbidden"),
    (_TRACE + '[[forbid]]\ncode = "*"\n', "needs a max_severity"),
    (_TRACE + '[[expect]]\ncode = "LAUNCH_BOUND"\nwindow_ns = [5, 1]\n', "window_ns"),
    (_TRACE + '[[expect]]\ncode = "LAUNCH_BOUND"\nseverity = "info"\n', "unknown [[expect]]"),
    (_TRACE + "[extra]\n", "unknown sections"),
    ("[trace\n", "cannot read label"),
])
def test_bad_labels_are_refused(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        ev.parse_label(_write(tmp_path, body), CATALOGUE)


def test_a_missed_expectation_and_a_forbidden_finding_fail(tmp_path: Path) -> None:
    """The runner can fail: the tiny trace has STARTUP_COST and NVTX_MISSING at info only,
    no LAUNCH_BOUND, and its STARTUP_COST window is the 17 ms launch, not [0, 1)."""
    label = ev.parse_label(_write(tmp_path, (
        '[trace]\nbuilder = "nsysan.testing.eval_traces:tiny_first_launch"\n'
        'derivation = "planted"\n'
        '[[expect]]\ncode = "LAUNCH_BOUND"\n'
        '[[expect]]\ncode = "STARTUP_COST"\nmin_severity = "warning"\n'
        '[[expect]]\ncode = "STARTUP_COST"\nwindow_ns = [0, 1]\n'
        '[[expect]]\ncode = "STARTUP_COST"\nwindow_ns = [20000000, 21000000]\n'
        '[[forbid]]\ncode = "NVTX_MISSING"\n'
        '[[forbid]]\ncode = "MEMORY_CHURN"\nmax_severity = "info"\n'
        '[verdict]\nlabel = "compute-bound"\n')), CATALOGUE)
    result = ev.run_label(label, tmp_path)
    failed = {(c.kind, c.code) for c in result.failures}
    assert failed == {("expect", "LAUNCH_BOUND"), ("expect", "STARTUP_COST"),
                      ("forbid", "NVTX_MISSING"),
                      ("verdict", "verdict")}
    s = ev.score([result])
    assert s["LAUNCH_BOUND"] == {"tp": 0, "fn": 1, "fp": 0, "tn": 0}
    assert s["NVTX_MISSING"] == {"tp": 0, "fn": 0, "fp": 1, "tn": 0}
    # the 17 ms launch's gap overlaps [20, 21) ms, not [0, 1) ns; no warning
    assert s["STARTUP_COST"] == {"tp": 1, "fn": 2, "fp": 0, "tn": 0}
    assert s["MEMORY_CHURN"] == {"tp": 0, "fn": 0, "fp": 0, "tn": 1}
    page = ev.render_scores([result])
    assert "| `NVTX_MISSING` | 0 | 0 | 1 | 0 | 0.00 | n/a |" in page
    assert "## Failures" in page


def test_scores_file_is_in_the_repository() -> None:
    """(Not compared with a fresh run: labels added in other branches change the counts;
    `python -m nsysan.testing.eval --write bench/eval_scores.md` refreshes it.)"""
    page = (ev.REPO / "bench" / "eval_scores.md").read_text(encoding="utf-8")
    assert page.startswith("# Evaluation corpus scores")
    assert "| code | TP | FN | FP | TN | precision | recall |" in page
