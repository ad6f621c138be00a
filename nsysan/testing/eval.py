"""The evaluation corpus: labelled traces, what nsysan must and must not find in them, and
the scores (precision / recall per finding code).

Labels live in ``tests/eval/labels/*.toml``, one file per trace (format: tests/eval/README.md).
Each names its trace (a builder function of a planted trace, a shared real trace, or a project
fixture), the findings that must appear (code, minimum severity, optional time window) and
those that must not, and says how the labels were derived. `run_label` analyses the trace and
checks every expectation; `score` counts per code: TP (a required finding found), FN (missed),
FP (a forbidden finding present), TN (absent as it should be).

    python -m nsysan.testing.eval --write bench/eval_scores.md
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsysan.errors import ConfigError
from nsysan.passes.base import SEVERITIES

try:  # stdlib from Python 3.11; on 3.10 the same parser as `tomli` (a pytest dependency there)
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
LABELS = REPO / "tests" / "eval" / "labels"
#: ../shared/traces, or $NSYSAN_SHARED_TRACES (as tests/conftest.py)
SHARED = Path(os.environ.get("NSYSAN_SHARED_TRACES") or REPO.parent / "shared" / "traces")
_TRACE_KEYS = {"builder", "args", "shared", "fixture", "derivation", "job"}
_EXPECT_KEYS = {"code", "min_severity", "window_ns", "why"}
_FORBID_KEYS = {"code", "max_severity", "why"}


@dataclass(frozen=True)
class Expect:
    code: str
    min_severity: str = "info"
    window_ns: tuple[int, int] | None = None
    why: str = ""


@dataclass(frozen=True)
class Forbid:
    code: str
    max_severity: str | None = None  # None: must not appear at all
    why: str = ""
    implicit: bool = False  # from ``code = "*"`` (not counted as a negative label by coverage)


@dataclass(frozen=True)
class Label:
    name: str
    path: Path
    trace: Mapping[str, Any]
    derivation: str
    settings: Mapping[str, str] = field(default_factory=dict)
    job_params: Mapping[str, Any] = field(default_factory=dict)
    expect: tuple[Expect, ...] = ()
    forbid: tuple[Forbid, ...] = ()
    verdict: str | None = None
    verdict_not: tuple[str, ...] = ()

    @property
    def is_job(self) -> bool:
        return bool(self.trace.get("job", False))


@dataclass(frozen=True)
class Check:
    label: str
    code: str
    kind: str  # expect | forbid | verdict
    ok: bool
    detail: str


@dataclass
class LabelResult:
    label: Label
    checks: list[Check]
    skipped: str | None = None  # why the trace could not be had (a shared trace absent)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def _bad(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {msg}")


def _severity(path: Path, value: Any, what: str) -> str:
    if value not in SEVERITIES:
        raise _bad(path, f"{what} must be one of {', '.join(SEVERITIES)}, got {value!r}")
    return value


def parse_label(path: Path, known_codes: Iterable[str] | None = None) -> Label:
    """One label file, validated (unknown keys, codes or severities are errors)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise _bad(path, f"cannot read label: {exc}") from None
    codes = set(known_codes) if known_codes is not None else None
    unknown = set(data) - {"trace", "analyze", "expect", "forbid", "verdict"}
    if unknown:
        raise _bad(path, f"unknown sections {sorted(unknown)}")
    trace = data.get("trace")
    if not isinstance(trace, dict):
        raise _bad(path, "a [trace] section is required")
    if set(trace) - _TRACE_KEYS:
        raise _bad(path, f"unknown [trace] keys {sorted(set(trace) - _TRACE_KEYS)}")
    sources = [k for k in ("builder", "shared", "fixture") if k in trace]
    if len(sources) != 1:
        raise _bad(path, "[trace] needs exactly one of builder, shared, fixture")
    derivation = str(trace.get("derivation", "")).strip()
    if not derivation:
        raise _bad(path, "[trace] derivation is required: say how the labels were derived")

    def code_of(row: Mapping[str, Any], what: str) -> str:
        code = row.get("code")
        if what == "[[forbid]]" and code == "*":  # every code the file does not name
            if row.get("max_severity") is None:
                raise _bad(path, 'code = "*" needs a max_severity')
            return code
        if not isinstance(code, str) or (codes is not None and code not in codes):
            raise _bad(path, f"{what}: unknown finding code {code!r}")
        return code

    expect = []
    for row in data.get("expect", []):
        if set(row) - _EXPECT_KEYS:
            raise _bad(path, f"unknown [[expect]] keys {sorted(set(row) - _EXPECT_KEYS)}")
        win = row.get("window_ns")
        if win is not None and (len(win) != 2 or not win[0] < win[1]):
            raise _bad(path, f"window_ns must be [start, end] with start < end, got {win}")
        expect.append(Expect(code_of(row, "[[expect]]"),
                             _severity(path, row.get("min_severity", "info"), "min_severity"),
                             tuple(win) if win is not None else None, row.get("why", "")))
    forbid = []
    for row in data.get("forbid", []):
        if set(row) - _FORBID_KEYS:
            raise _bad(path, f"unknown [[forbid]] keys {sorted(set(row) - _FORBID_KEYS)}")
        mx = row.get("max_severity")
        forbid.append(Forbid(code_of(row, "[[forbid]]"),
                             None if mx is None else _severity(path, mx, "max_severity"),
                             row.get("why", "")))
    if codes is not None:  # "*": one forbid per catalogue code the file does not name
        named = {e.code for e in expect} | {f.code for f in forbid if f.code != "*"}
        for star in [f for f in forbid if f.code == "*"]:
            forbid.remove(star)
            forbid += [Forbid(c, star.max_severity, star.why or "healthy: nothing above "
                              f"{star.max_severity}", implicit=True)
                       for c in sorted(codes) if c not in named]
    both = {e.code for e in expect} & {f.code for f in forbid}
    if both:
        raise _bad(path, f"codes both expected and forbidden: {sorted(both)}")
    analyze = data.get("analyze", {})
    verdict = data.get("verdict", {})
    return Label(
        name=path.stem, path=path, trace=trace, derivation=derivation,
        settings={str(k): str(v) for k, v in analyze.get("settings", {}).items()},
        job_params=dict(analyze.get("job_params", {})),
        expect=tuple(expect), forbid=tuple(forbid),
        verdict=verdict.get("label"), verdict_not=tuple(verdict.get("not", ())),
    )


def load_labels(directory: Path = LABELS) -> list[Label]:
    """Every ``*.toml`` label in ``directory``, by file name."""
    from nsysan.findings.catalogue import CATALOGUE

    return [parse_label(p, CATALOGUE) for p in sorted(directory.glob("*.toml"))]


def materialise(label: Label, workdir: Path) -> Path | None:
    """The trace (or, for a job, the directory of rank traces) of ``label``; None when a
    shared trace is absent (callers skip, or fail under CI)."""
    t = label.trace
    if "shared" in t:
        path = SHARED / t["shared"]
        return path if path.exists() else None
    if "fixture" in t:
        path = REPO / t["fixture"]
        if not path.exists():
            raise _bad(label.path, f"fixture {t['fixture']} not found")
        return path
    module, _, func = str(t["builder"]).partition(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise _bad(label.path, f"builder {t['builder']!r}: {exc}") from None
    target = workdir / label.name if label.is_job else workdir / f"{label.name}.sqlite"
    out = fn(target, **dict(t.get("args", {})))
    if label.is_job:
        return target
    if isinstance(out, tuple):
        out = out[0]
    return Path(out) if out is not None else target


def _findings(label: Label, path: Path) -> tuple[list[Any], str | None]:
    """(findings, verdict label) of the analysis of the label's trace."""
    if label.is_job:
        from nsysan.multirank.job import JobParams, analyze_job

        res = analyze_job(path, params=JobParams(**label.job_params))
        return list(res.findings), None
    import nsysan.api as api

    result = api.analyze(path, settings=dict(label.settings) or None)
    d = result.diagnosis
    return list(d.findings), d.verdict.label


def _overlaps(f: Any, win: tuple[int, int]) -> bool:
    return any(w["start_ns"] < win[1] and w["end_ns"] > win[0]
               for w in f.evidence.get("windows", []))


def run_label(label: Label, workdir: Path) -> LabelResult:
    """Analyse the label's trace and check every expectation."""
    path = materialise(label, workdir)
    if path is None:
        return LabelResult(label, [], skipped=f"shared trace {label.trace['shared']} absent")
    findings, verdict = _findings(label, path)
    rank = SEVERITIES.index
    checks = []
    for e in label.expect:
        hits = [f for f in findings if f.code == e.code
                and rank(f.severity) >= rank(e.min_severity)
                and (e.window_ns is None or _overlaps(f, e.window_ns))]
        got = sorted({f.severity for f in findings if f.code == e.code}, key=rank)
        checks.append(Check(label.name, e.code, "expect", bool(hits),
                            f"needs >= {e.min_severity}"
                            + (f" in window {list(e.window_ns)}" if e.window_ns else "")
                            + f"; found {got or 'nothing'}"))
    for fb in label.forbid:
        bad = [f for f in findings if f.code == fb.code
               and (fb.max_severity is None or rank(f.severity) > rank(fb.max_severity))]
        checks.append(Check(label.name, fb.code, "forbid", not bad,
                            f"allowed up to {fb.max_severity or 'absent'}; found "
                            + (", ".join(f"{f.severity}: {f.message[:160]}" for f in bad)
                               or "nothing above")))
    if label.verdict is not None or label.verdict_not:
        ok = ((label.verdict is None or verdict == label.verdict)
              and verdict not in label.verdict_not)
        checks.append(Check(label.name, "verdict", "verdict", ok,
                            f"want {label.verdict or 'not ' + '/'.join(label.verdict_not)}, "
                            f"got {verdict}"))
    return LabelResult(label, checks)


def run_all(labels: Iterable[Label], workdir: Path | None = None) -> list[LabelResult]:
    with tempfile.TemporaryDirectory(prefix="nsysan-eval-") as tmp:
        return [run_label(lb, Path(workdir or tmp)) for lb in labels]


def score(results: Iterable[LabelResult]) -> dict[str, dict[str, int]]:
    """Per finding code: tp, fn (expect checks), fp, tn (forbid checks)."""
    out: dict[str, dict[str, int]] = {}
    for r in results:
        for c in r.checks:
            if c.kind == "verdict":
                continue
            s = out.setdefault(c.code, {"tp": 0, "fn": 0, "fp": 0, "tn": 0})
            key = {("expect", True): "tp", ("expect", False): "fn",
                   ("forbid", True): "tn", ("forbid", False): "fp"}[(c.kind, c.ok)]
            s[key] += 1
    return dict(sorted(out.items()))


def render_scores(results: list[LabelResult]) -> str:
    """The scores page (bench/eval_scores.md)."""
    scores = score(results)
    ran = [r for r in results if r.skipped is None]
    lines = [
        "# Evaluation corpus scores",
        "",
        "<!-- generated by `python -m nsysan.testing.eval --write bench/eval_scores.md` -->",
        "",
        f"{len(ran)} of {len(results)} labelled traces analysed "
        f"({len(results) - len(ran)} skipped: shared trace absent). Per finding code: "
        "TP = a required finding found, FN = missed, FP = a forbidden finding present, "
        "TN = absent as labelled. precision = TP / (TP + FP), recall = TP / (TP + FN).",
        "",
        "| code | TP | FN | FP | TN | precision | recall |",
        "|---|---|---|---|---|---|---|",
    ]

    def ratio(a: int, b: int) -> str:
        return f"{a / b:.2f}" if b else "n/a"

    for code, s in scores.items():
        lines.append(f"| `{code}` | {s['tp']} | {s['fn']} | {s['fp']} | {s['tn']} | "
                     f"{ratio(s['tp'], s['tp'] + s['fp'])} | {ratio(s['tp'], s['tp'] + s['fn'])} |")
    verdicts = [c for r in results for c in r.checks if c.kind == "verdict"]
    lines += ["", f"Verdict labels: {sum(c.ok for c in verdicts)} of {len(verdicts)} as labelled."]
    fails = [c for r in results for c in r.failures]
    if fails:
        lines += ["", "## Failures", ""]
        lines += [f"- `{c.label}` {c.kind} `{c.code}`: {c.detail}" for c in fails]
    lines += ["", "## Labelled traces", ""]
    for r in results:
        src = next(f"{k} `{r.label.trace[k]}`" for k in ("builder", "shared", "fixture")
                   if k in r.label.trace)
        lines.append(f"- `{r.label.name}` ({src})" + (f": skipped, {r.skipped}"
                                                      if r.skipped else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nsysan.testing.eval", description=__doc__)
    ap.add_argument("--labels", type=Path, default=LABELS, help="label directory")
    ap.add_argument("--write", type=Path, help="write the scores page here")
    args = ap.parse_args(argv)
    results = run_all(load_labels(args.labels))
    page = render_scores(results)
    if args.write:
        args.write.write_text(page, encoding="utf-8")
    else:
        sys.stdout.write(page)
    fails = [c for r in results for c in r.failures]
    for c in fails:
        print(f"FAIL {c.label} {c.kind} {c.code}: {c.detail}", file=sys.stderr)
    return 1 if fails or (os.environ.get("CI") == "true" and any(r.skipped for r in results)) \
        else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
