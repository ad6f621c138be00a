"""Performance budgets: TOML rules over the metric model, checked by ``nsysan check``.

A rule is ``METRIC OP LIMIT`` (see docs/budget.md):

* ``METRIC`` is a metric of `nsysan.compare.metrics.CATALOGUE`, optionally with a selector
  and a statistic: ``[KIND["SELECTOR"].]NAME[.STAT]``. ``KIND`` is layer, kernel, nccl, state
  or idle; ``SELECTOR`` a layer / kernel short name / NCCL op / state / idle cause, with ``*``
  and ``?`` wildcards for additive metrics (matches are summed); ``STAT`` one of mean, p50,
  p90, p95, p99, min, max over the per-step samples. Time units can be written as ``ns``,
  ``us``, ``ms`` or ``s`` and fractions as ``frac`` or ``pct`` anywhere the canonical name has
  ``ns`` / ``frac`` (``exposed_nccl_ms_per_step``, ``gpu_busy_pct``).
* ``OP`` is ``<=``, ``<``, ``>=`` or ``>``.
* ``LIMIT`` is a number, or relative to the baseline: ``baseline``, ``baseline * 1.03``,
  ``baseline + 2``, ``baseline - 0.5``, ``1.03 * baseline``.

Rules are validated when the file is loaded (unknown metric, bad selector, bad statistic or
limit: `ConfigError` naming the rule). Each rule then holds, is violated, or is not comparable
(no value, no baseline value, or the run and the baseline are not comparable).
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

import numpy as np

from nsysan.compare.diff import DiffParams, comparability
from nsysan.compare.metrics import KINDS, SPECS, MetricSet, MetricSpec, metric_key
from nsysan.compare.stats import STATS, statistic
from nsysan.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

OPS = {"<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater}
#: unit spellings accepted in place of the canonical token, and the factor from canonical
ALIASES = {"ns": {"ns": 1.0, "us": 1e-3, "ms": 1e-6, "s": 1e-9}, "frac": {"frac": 1.0,
                                                                          "pct": 100.0}}
_RULE_RE = re.compile(
    r"""^\s*(?:(?P<kind>[a-z]+)\s*\[\s*(?P<q>["'])(?P<sel>(?:\\.|(?!(?P=q)).)*)(?P=q)\s*\]\s*\.)?
        \s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<stat>[a-z0-9]+))?
        \s*(?P<op><=|>=|<|>)\s*(?P<rhs>.+?)\s*$""", re.VERBOSE)
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ABS = re.compile(rf"^{_NUM}$")
_REL = re.compile(rf"^baseline(?:\s*(?P<o>[*+-])\s*(?P<n>{_NUM}))?$")
_REL_LEFT = re.compile(rf"^(?P<n>{_NUM})\s*\*\s*baseline$")
STATUSES = ("pass", "fail", "not comparable")


@dataclass(frozen=True)
class Rule:
    index: int  # 1-based position in the file
    text: str  # as written
    name: str  # the rule's name (its text when unnamed)
    kind: str | None
    selector: str | None
    metric: str  # canonical name
    stat: str | None
    scale: float  # canonical value * scale = value in the rule's unit
    unit: str  # the rule's unit spelling (ms, pct, ...)
    op: str
    relative: bool
    rhs_op: str  # * | + | -
    number: float

    @property
    def spec(self) -> MetricSpec:
        return SPECS[(self.kind, self.metric)]

    @property
    def unit_label(self) -> str:
        """The unit shown after values: the rule's spelling (ms, pct, ...)."""
        if self.spec.unit in ("count", "frac") and self.unit != "pct":
            return ""
        return {"1/s": "/s", "pct": "%"}.get(self.spec.unit if self.spec.unit == "1/s"
                                             else self.unit, self.unit)

    def limit(self, baseline: float | None) -> float | None:
        if not self.relative:
            return self.number
        if baseline is None:
            return None
        return {"*": baseline * self.number, "+": baseline + self.number,
                "-": baseline - self.number}[self.rhs_op]


@dataclass
class Budget:
    path: str
    rules: list[Rule]
    baseline: str | None = None  # default baseline named in the file

    @property
    def relative(self) -> bool:
        return any(r.relative for r in self.rules)


@dataclass
class RuleResult:
    rule: Rule
    status: str  # pass | fail | not comparable
    value: float | None = None  # in the rule's unit
    limit: float | None = None
    baseline: float | None = None
    reason: str | None = None
    matched: list[str] = field(default_factory=list)

    def line(self) -> str:
        tag = {"pass": "PASS", "fail": "FAIL", "not comparable": "N/A "}[self.status]
        r = self.rule
        if self.status == "not comparable":
            return f"{tag} {r.name}: not comparable: {self.reason}"
        unit = f" {r.unit_label}" if r.unit_label else ""
        base = f" (baseline {_num(self.baseline)}{unit})" if r.relative else ""
        return (f"{tag} {r.name}: {_num(self.value)}{unit} {r.op} {_num(self.limit)}{unit}"
                f"{base}")


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _spellings(name: str) -> list[tuple[str, float, str | None]]:
    """``(candidate canonical name, scale, unit spelling)`` for a name with unit aliases."""
    out: list[tuple[str, float, str | None]] = [(name, 1.0, None)]
    tokens = name.split("_")
    for i, tok in enumerate(tokens):
        for canon, spellings in ALIASES.items():
            if tok in spellings:
                out.append(("_".join([*tokens[:i], canon, *tokens[i + 1:]]), spellings[tok],
                            tok))
    return out


def _canonical(kind: str | None, name: str) -> tuple[str, float, str]:
    """``(canonical name, scale, unit spelling)`` of a metric name with unit aliases."""
    for cand, scale, tok in _spellings(name):
        if (kind, cand) in SPECS:
            unit = tok or ("ns" if "ns" in cand.split("_") else SPECS[(kind, cand)].unit)
            return cand, scale, unit
    if kind is None:
        for cand, _, _ in _spellings(name):
            owners = [s for s in SPECS.values() if s.kind is not None and s.name == cand]
            if owners:
                kinds = " or ".join(f'{s.kind}["NAME"].{name}' for s in owners)
                raise ValueError(f"bad selector: {cand} is per "
                                 f"{'/'.join(str(s.kind) for s in owners)} (write {kinds})")
    known = [s.name for s in SPECS.values() if s.kind == kind]
    hint = get_close_matches(name, known, n=1)
    where = f"{kind}[...] metric" if kind else "metric"
    did = f" (did you mean {hint[0]!r}?)" if hint else f"; known: {', '.join(sorted(known))}"
    raise ValueError(f"unknown {where} {name!r}{did}")


def parse_rule(text: str, index: int = 1, name: str | None = None) -> Rule:
    """One rule; ValueError with a one-line reason when it is malformed."""
    m = _RULE_RE.match(text)
    if not m and re.match(rf"^\s*({'|'.join(KINDS)})\s*[.\[]", text):
        raise ValueError("bad selector: write KIND[\"NAME\"].metric, e.g. "
                         "layer[\"forward\"].exclusive_ms_per_step")
    if not m:
        raise ValueError("expected METRIC OP LIMIT, e.g. 'gpu_busy_frac >= 0.85' or "
                         "'layer[\"attention\"].exclusive_ms_per_step <= baseline * 1.03'")
    kind, sel, stat = m["kind"], m["sel"], m["stat"]
    if kind is not None and kind not in KINDS:
        raise ValueError(f"bad selector {kind}[...]: kinds are {', '.join(KINDS)}")
    if sel is not None:
        sel = re.sub(r"\\(.)", r"\1", sel)
        if not sel:
            raise ValueError(f"bad selector {kind}[\"\"]: empty")
    name_, scale, unit = _canonical(kind, m["name"])
    spec = SPECS[(kind, name_)]
    if stat is not None:
        if stat not in STATS:
            raise ValueError(f"bad statistic .{stat}: use one of {', '.join(STATS)}")
        if not spec.sampled:
            raise ValueError(f"bad selector .{stat}: {name_} has no per-step samples")
    if sel is not None and any(c in sel for c in "*?[") and not spec.additive:
        raise ValueError(f"bad selector {kind}[{sel!r}]: wildcards need an additive metric "
                         f"({name_} is not: name one {kind} exactly)")
    relative, rhs_op, number = _parse_limit(m["rhs"].strip())
    return Rule(index, text.strip(), name or text.strip(), kind, sel, name_, stat, scale, unit,
                m["op"], relative, rhs_op, number)


def _parse_limit(rhs: str) -> tuple[bool, str, float]:
    """``(relative, op, number)`` of a limit: ``3``, ``baseline``, ``baseline * 1.03``,
    ``baseline + 2``, ``1.03 * baseline``."""
    if _ABS.match(rhs):
        return False, "*", float(rhs)
    g = _REL.match(rhs)
    if g:
        return (True, g["o"], float(g["n"])) if g["o"] else (True, "*", 1.0)
    g = _REL_LEFT.match(rhs)
    if g:
        return True, "*", float(g["n"])
    raise ValueError(f"bad limit {rhs!r}: a number, or baseline [* + -] a number")


def load(path: str | Path) -> Budget:
    """Read and validate a budget file (TOML)."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"budget file {p} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read budget file {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    return from_dict(doc, str(p))


def from_dict(doc: dict[str, Any], where: str = "budget") -> Budget:
    unknown = set(doc) - {"baseline", "rules", "rule"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a budget has "
                          "'baseline', 'rules' (strings) and [[rule]] tables")
    entries: list[tuple[str, str | None]] = []
    rules = doc.get("rules", [])
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        raise ConfigError(f"{where}: 'rules' must be a list of strings")
    entries += [(r, None) for r in rules]
    tables = doc.get("rule", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{where}: use [[rule]] (an array of tables) for named rules")
    for i, t in enumerate(tables, start=len(entries) + 1):
        extra = set(t) - {"check", "name"}
        if "check" not in t or not isinstance(t["check"], str) or extra:
            raise ConfigError(f"{where}: rule {i}: a [[rule]] needs check = \"METRIC OP LIMIT\" "
                              "and optionally name = \"...\"")
        entries.append((t["check"], t.get("name")))
    if not entries:
        raise ConfigError(f"{where}: no rules; add rules = [\"gpu_busy_frac >= 0.85\"]")
    parsed = []
    for i, (text, name) in enumerate(entries, start=1):
        try:
            parsed.append(parse_rule(text, i, name))
        except ValueError as exc:
            raise ConfigError(f"{where}: rule {i} {text.strip()!r}: {exc}") from None
    baseline = doc.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise ConfigError(f"{where}: 'baseline' must be a string (a name or a directory)")
    return Budget(where, parsed, baseline)


# ---------------------------------------------------------------------------------------------
def measure(rule: Rule, ms: MetricSet) -> tuple[float | None, str | None, list[str]]:
    """The rule's metric in run ``ms`` (in the rule's unit), or why there is none."""
    if rule.kind is None:
        m = ms.get(rule.metric)
        if m is None or m.value is None:
            why = (m.note if m is not None else None) or f"{rule.metric} not measured"
            return None, why, []
        found = [m]
    else:
        have = ms.selectors(rule.kind, rule.metric)
        assert rule.selector is not None
        names = [s for s in have if fnmatch.fnmatchcase(s, rule.selector)]
        if not names and rule.kind == "idle" and have:
            # idle causes come and go: a run whose idle time is decomposed but holds no gap of
            # this cause spent no time in it
            return 0.0, None, []
        if not names:
            some = ", ".join(sorted(have)[:8]) or "none"
            return None, f"no {rule.kind} matches {rule.selector!r} (have: {some})", []
        found = [ms.get(rule.metric, rule.kind, n) for n in names]  # type: ignore[misc]
    if rule.stat is None:
        value = float(sum(m.value for m in found if m.value is not None))
    else:
        if any(m.samples is None for m in found):
            return None, f"{rule.metric} has no per-step samples in this run", []
        x = np.sum([m.samples for m in found], axis=0)
        w = found[0].weights if len(found) == 1 else None
        value = statistic(np.asarray(x, dtype=float), w, rule.stat)
    return value * rule.scale, None, [m.key for m in found]


def evaluate(budget: Budget, run: MetricSet, baseline: MetricSet | None = None,
             params: DiffParams | None = None) -> list[RuleResult]:
    """Check every rule of ``budget`` on ``run`` (relative rules against ``baseline``)."""
    params = params or DiffParams()
    check = comparability(baseline, run, params) if baseline is not None else None
    out = []
    for rule in budget.rules:
        value, why, matched = measure(rule, run)
        res = RuleResult(rule, "not comparable", value, matched=matched)
        if why is not None:
            res.reason = why
            out.append(res)
            continue
        if rule.relative:
            if baseline is None or check is None:
                res.reason = "the rule needs a baseline: pass --baseline NAME|DIR"
                out.append(res)
                continue
            reason = check.reason_for(rule.spec, ("steps",) if rule.spec.per_step else ())
            if reason is not None:
                res.reason = f"run and baseline: {reason}"
                out.append(res)
                continue
            bval, bwhy, _ = measure(rule, baseline)
            if bval is None:
                res.reason = f"baseline: {bwhy}"
                out.append(res)
                continue
            res.baseline = bval
        res.limit = rule.limit(res.baseline)
        assert value is not None and res.limit is not None
        res.status = "pass" if bool(OPS[rule.op](value, res.limit)) else "fail"
        out.append(res)
    return out


def exit_code(results: list[RuleResult]) -> int:
    """0: every rule holds; 3: a rule is violated; 4: otherwise a rule is not comparable."""
    if any(r.status == "fail" for r in results):
        return 3
    if any(r.status == "not comparable" for r in results):
        return 4
    return 0


__all__ = ["Budget", "Rule", "RuleResult", "evaluate", "exit_code", "load", "metric_key",
           "parse_rule"]
