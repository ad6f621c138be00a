"""Budgets: parsing and validation, every rule kind (hold / violate / not comparable), exit
codes through the CLI, JUnit XML and the step summary."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import diff_pairs
import polars as pl
import pytest
from click.testing import CliRunner

from nsysan.cli import cli
from nsysan.compare import budget as bud
from nsysan.compare import metrics as M
from nsysan.compare.junit import junit_xml, step_summary
from nsysan.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return diff_pairs.get("exposed_allreduce", tmp_path_factory.getbasetemp() / "diff-pairs")


@pytest.fixture(scope="module")
def no_steps(pair) -> M.MetricSet:
    run = pair.new_run()
    return M.extract(dataclasses.replace(
        run, tables={k: v for k, v in run.tables.items() if k != "steps"}))


@pytest.fixture(scope="module")
def other_workload(pair) -> M.MetricSet:
    run = pair.base_run()
    k = run.tables["kernels"].with_columns(pl.format("x_{}", "short_name").alias("short_name"))
    return M.extract(dataclasses.replace(run, tables={**run.tables, "kernels": k}))


# -- parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu_busy_frac >= 0.85", (None, None, "gpu_busy_frac", None, 1.0, ">=", False, 0.85)),
        ("exposed_nccl_ms_per_step <= 3",
         (None, None, "exposed_nccl_ns_per_step", None, 1e-6, "<=", False, 3.0)),
        ('layer["attention"].exclusive_ms_per_step <= baseline * 1.03',
         ("layer", "attention", "exclusive_ns_per_step", None, 1e-6, "<=", True, 1.03)),
        ("step_time_us.p95 < 1.1 * baseline",
         (None, None, "step_time_ns", "p95", 1e-3, "<", True, 1.1)),
        ("kernel['*gemm*'].count_per_step > 2",
         ("kernel", "*gemm*", "count_per_step", None, 1.0, ">", False, 2.0)),
        ('nccl["AllReduce"].busbw_gbps >= baseline - 5',
         ("nccl", "AllReduce", "busbw_gbps", None, 1.0, ">=", True, 5.0)),
        ("gpu_busy_pct >= 85", (None, None, "gpu_busy_frac", None, 100.0, ">=", False, 85.0)),
        ('state["idle"].s_per_step <= 1e-3',
         ("state", "idle", "ns_per_step", None, 1e-9, "<=", False, 1e-3)),
    ],
)
def test_parse_rule(text, expected):
    r = bud.parse_rule(text)
    assert (r.kind, r.selector, r.metric, r.stat, r.scale, r.op, r.relative, r.number) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu_busy_fraq >= 0.8", "unknown metric 'gpu_busy_fraq' (did you mean 'gpu_busy_frac'?)"),
        ('layer["x"].mean_ns < 3', "unknown layer[...] metric 'mean_ns'"),
        ("exclusive_ms_per_step < 3", 'bad selector: exclusive_ns_per_step is per layer'),
        ("layer.exclusive_ms_per_step < 3", "bad selector: write KIND"),
        ('foo["x"].y < 1', "bad selector foo[...]"),
        ('kernel["*gemm*"].mean_ns <= 5', "wildcards need an additive metric"),
        ('kernel[""].mean_ns < 1', "empty"),
        ('kernel["x"].mean_ns.p95 <= 3', "bad selector .p95: mean_ns has no per-step samples"),
        ("step_time_ms.p97 <= 40", "bad statistic .p97"),
        ("step_time_ms <= basline", "bad limit 'basline'"),
        ("step_time_ms", "expected METRIC OP LIMIT"),
        ("step_time_ms == 3", "expected METRIC OP LIMIT"),
    ],
)
def test_parse_rule_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bud.parse_rule(text)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("rules = [", "invalid TOML"),
        ("limits = []", "unknown key(s) limits"),
        ("rules = []", "no rules"),
        ("rules = [1]", "'rules' must be a list of strings"),
        ("[[rule]]\nname = 'x'", "rule 1: a [[rule]] needs check"),
        ("baseline = 3\nrules = ['gpu_busy_frac > 0']", "'baseline' must be a string"),
        ("rules = ['gpu_busy_frac > 0', 'nope > 1']", "rule 2 'nope > 1': unknown metric"),
    ],
)
def test_load_errors_name_the_file_and_rule(tmp_path, toml, message):
    p = tmp_path / "b.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError, match=re.escape(message)) as exc:
        bud.load(p)
    assert str(p) in str(exc.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        bud.load(tmp_path / "none.toml")


def test_documented_budget_is_valid(tmp_path):
    doc = (REPO / "docs" / "budget.md").read_text()
    block = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    p = tmp_path / "budget.toml"
    p.write_text(block)
    b = bud.load(p)
    assert b.baseline == "main" and len(b.rules) == 9 and b.relative
    assert b.rules[-1].name == "no data-loader stalls"


# -- evaluation: every rule kind, hold / violate / not comparable ---------------------------------
# (rule, uses baseline, expected status). NEW: base + 3 ms of exposed AllReduce per step.
CASES = [
    # absolute, run-wide
    ("exposed_nccl_ms_per_step <= 3.5", False, "pass"),
    ("exposed_nccl_ms_per_step <= 1", False, "fail"),
    # relative to the baseline
    ("step_time_ms <= baseline * 1.2", True, "pass"),
    ("step_time_ms <= baseline * 1.03", True, "fail"),
    # per-step percentile selector
    ("step_time_ms.p95 <= 40", False, "pass"),
    ("step_time_ms.p95 <= 30", False, "fail"),
    # layer selector
    ('layer["NCCL:ncclAllReduce"].exclusive_ms_per_step <= 5', False, "pass"),
    ('layer["NCCL:ncclAllReduce"].exclusive_ms_per_step <= baseline + 1', True, "fail"),
    ('layer["attention"].exclusive_ms_per_step <= 3', False, "not comparable"),
    # kernel selector with a wildcard (10 + 6 GEMMs per step)
    ('kernel["*gemm*"].count_per_step <= 16', False, "pass"),
    ('kernel["*gemm*"].count_per_step < 16', False, "fail"),
    ('kernel["nope*"].count_per_step < 16', False, "not comparable"),
    # NCCL op selector
    ('nccl["AllReduce"].exposed_ms_per_step <= 3.5', False, "pass"),
    ('nccl["AllReduce"].time_ms_per_step <= baseline', True, "fail"),
    ('nccl["AllGather"].exposed_ms_per_step <= 1', False, "not comparable"),
    # engine state and idle cause (a cause that never occurred is 0)
    ('state["communication"].ms_per_step <= 1', False, "fail"),
    ('state["compute"].ms_per_step.p50 <= baseline * 1.01', True, "pass"),
    ('idle["DataLoader.__next__"].ms_per_step <= 0.5', False, "pass"),
    ('idle["short gaps"].ms_per_step <= 0.1', False, "fail"),
]


@pytest.mark.parametrize(("text", "relative", "status"), CASES)
def test_rule_kinds(pair, text, relative, status):
    rule = bud.parse_rule(text)
    assert rule.relative == relative
    [res] = bud.evaluate(bud.Budget("t", [rule]), pair.new, pair.base)
    assert res.status == status, res.line()
    if status != "not comparable":
        assert res.value is not None and res.limit is not None
        assert res.line().startswith("PASS" if status == "pass" else "FAIL")
    else:
        assert res.reason and res.line().startswith("N/A")


@pytest.mark.parametrize("text", [c[0] for c in CASES if c[2] != "not comparable"])
def test_rules_not_comparable_without_what_they_need(pair, no_steps, other_workload, text):
    rule = bud.parse_rule(text)
    budget = bud.Budget("t", [rule])
    if rule.relative:  # a baseline of another workload, or none at all
        [res] = bud.evaluate(budget, pair.new, other_workload)
        assert res.status == "not comparable" and "different workloads" in res.reason
        [res] = bud.evaluate(budget, pair.new, None)
        assert res.status == "not comparable" and "needs a baseline" in res.reason
    elif rule.spec.per_step:  # per-step metrics on a run without steps
        [res] = bud.evaluate(budget, no_steps, None)
        assert res.status == "not comparable", res.line()


@pytest.mark.parametrize(
    ("statuses", "code"),
    [(["pass", "pass"], 0), (["pass", "fail"], 3), (["pass", "not comparable"], 4),
     (["fail", "not comparable"], 3), ([], 0)],
)
def test_exit_code(statuses, code):
    rule = bud.parse_rule("gpu_busy_frac >= 0")
    assert bud.exit_code([bud.RuleResult(rule, s) for s in statuses]) == code


# -- CLI, JUnit, summary -------------------------------------------------------------------------
def _budget(tmp_path: Path, *rules: str, baseline: str | None = None) -> Path:
    p = tmp_path / "budget.toml"
    head = f'baseline = "{baseline}"\n' if baseline else ""
    p.write_text(head + "rules = [\n" + "".join(f"  {r!r},\n" for r in rules) + "]\n")
    return p


@pytest.mark.parametrize(
    ("rules", "code"),
    [
        (["gpu_busy_frac >= 0.85", "step_time_ms <= baseline * 1.2"], 0),
        (["gpu_busy_frac >= 0.85", "exposed_nccl_ms_per_step <= 1",
          'layer["attention"].exclusive_ms_per_step <= 3'], 3),
        (["gpu_busy_frac >= 0.85", 'layer["attention"].exclusive_ms_per_step <= 3'], 4),
    ],
)
def test_cli_check_exit_codes_junit_and_summary(pair, tmp_path, monkeypatch, rules, code):
    summary = tmp_path / "gh-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    budget = _budget(tmp_path, *rules, baseline=str(pair.base_path))
    junit = tmp_path / "out" / "budget.xml"
    r = CliRunner().invoke(cli, ["check", str(pair.new_path), "--budget", str(budget),
                                 "--junit", str(junit)])
    assert r.exit_code == code, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == len(rules)  # one line per rule
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    [suite] = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == rules
    n_fail = sum(c.find("failure") is not None for c in cases)
    n_err = sum(c.find("error") is not None for c in cases)
    assert (int(suite.get("tests")), int(suite.get("failures")), int(suite.get("errors"))) == \
        (len(rules), n_fail, n_err)
    assert n_fail == sum(line.startswith("FAIL") for line in lines)
    assert n_err == sum(line.startswith("N/A") for line in lines)
    text = summary.read_text()
    assert text.startswith("## nsysan check") and text.count("\n| ") == len(rules) + 1


def test_junit_with_junitparser_when_installed(pair):
    junitparser = pytest.importorskip("junitparser")
    rules = [bud.parse_rule(t) for t in ("gpu_busy_frac >= 0.85", "exposed_nccl_ms_per_step < 1")]
    results = bud.evaluate(bud.Budget("t", rules), pair.new)
    xml = junitparser.JUnitXml.fromstring(junit_xml(results, suite="b", trace_id="x"))
    suite = next(iter(xml))
    assert (suite.tests, suite.failures) == (2, 1)


def test_step_summary_lists_every_rule(pair):
    texts = ("gpu_busy_frac >= 0.85", 'layer["x"].exclusive_ms_per_step < 1')
    rules = [bud.parse_rule(t) for t in texts]
    text = step_summary(bud.evaluate(bud.Budget("t", rules), pair.new), trace_id="t",
                        budget="b.toml", baseline=None)
    assert "⚠️ 1 of 2 rules not comparable" in text and "✅" in text


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        (["gpu_busy_fraq >= 0.85"], "unknown metric 'gpu_busy_fraq'"),
        (["step_time_ms <= baseline"], "no baseline was given"),
    ],
)
def test_cli_check_invalid_budget_exits_1_before_analysis(tmp_path, rules, message):
    budget = _budget(tmp_path, *rules)
    r = CliRunner().invoke(cli, ["check", str(tmp_path / "missing.sqlite"), "--budget",
                                 str(budget)])
    assert r.exit_code == 1
    assert message in r.output
