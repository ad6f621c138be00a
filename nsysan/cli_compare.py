"""``nsysan diff``, ``check``, ``baseline`` and ``scaling``: compare runs, gate CI.

Thin: parse, call `nsysan.compare`, render. Exit status: 0 ok; 1 error (bad input, invalid
budget); 2 usage; 3 a budget rule is violated (``check``) or a metric regressed (``diff
--fail-on-regression``); 4 the comparison is not possible (``check``: a rule not comparable and
none violated; ``diff --fail-on-regression``: nothing comparable; ``scaling``: the runs are
not comparable).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from nsysan.cli_types import FINITE

EXIT_VIOLATED = 3
EXIT_NOT_COMPARABLE = 4


def _store_options(fn: Any) -> Any:
    fn = click.option("--store", "store", type=click.Path(file_okay=False, path_type=Path),
                      default=None, envvar="NSYSAN_BASELINES",
                      help="Local baseline directory (default: $NSYSAN_BASELINES, else "
                      "~/.local/share/nsysan/baselines).")(fn)
    fn = click.option("--catalog", "catalog", default=None, envvar="NSYSAN_CATALOG",
                      metavar="URL|PATH",
                      help="Keep baselines in this run catalog (env NSYSAN_CATALOG).")(fn)
    return fn


def _analysis_options(fn: Any) -> Any:
    fn = click.option("--nsys", type=click.Path(path_type=Path), default=None,
                      help="The nsys binary used to export .nsys-rep/.qdrep inputs.")(fn)
    fn = click.option("--tokens-per-step", type=FINITE, default=None,
                      help="Tokens per step of traces analysed here (tokens/s metric).")(fn)
    fn = click.option("--samples-per-step", type=FINITE, default=None,
                      help="Samples per step of traces analysed here (samples/s metric).")(fn)
    return fn


def _input_paths(*args: str | None) -> list[Path]:
    """The arguments that name existing files or folders (traces, analysis folders; not
    baseline names): no output may be written over or into them."""
    return [Path(a) for a in args if a and os.path.lexists(a)]


def _options(samples: float | None, tokens: float | None, nsys: Path | None) -> dict[str, Any]:
    return {"samples_per_step": samples, "tokens_per_step": tokens,
            "nsys": str(nsys) if nsys else None}


@click.command("diff")
@click.argument("base")
@click.argument("new")
@click.option("-o", "--out", "out", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Write diff.md, diff.json, diff.parquet (+ picture) here.")
@click.option("--min-effect", type=FINITE, default=0.03, show_default=True,
              help="Smallest relative change reported as improved/regressed.")
@click.option("--confidence", type=FINITE, default=0.95, show_default=True,
              help="Confidence of the bootstrap interval of each change.")
@click.option("--min-similarity", type=FINITE, default=0.5, show_default=True,
              help="Kernel-mix similarity below which the runs are different workloads.")
@click.option("--fail-on-regression", is_flag=True, default=False,
              help=f"Exit {EXIT_VIOLATED} when a metric regressed, {EXIT_NOT_COMPARABLE} when "
              "the runs are not comparable.")
@click.option("--json", "as_json", is_flag=True, help="Print diff.json instead of a summary.")
@click.option("--devices", "devices", default=None, metavar="ID,...",
              help="Compare only these GPUs (device ids present in both runs); runs on "
              "different GPUs are otherwise not comparable.")
@_analysis_options
@_store_options
def diff_cmd(base: str, new: str, out: Path | None, min_effect: float, confidence: float,
             min_similarity: float, fail_on_regression: bool, as_json: bool,
             devices: str | None, samples_per_step: float | None,
             tokens_per_step: float | None, nsys: Path | None,
             catalog: str | None, store: Path | None) -> None:
    """Compare BASE and NEW, each a trace, an `analyze` output directory or a baseline name.

    Per metric: the change, its confidence interval and a verdict (improved, regressed,
    unchanged, not comparable); the change of step time by engine state and by layer."""
    from nsysan.compare import baseline as bl
    from nsysan.compare.diff import DiffParams, diff
    from nsysan.compare.render import DIFF_FILES, diff_json, summary_lines, write_diff
    from nsysan.compare.stats import StatsParams
    from nsysan.report.targets import check_files

    params = DiffParams(StatsParams(min_effect=min_effect, confidence=confidence),
                        min_kernel_mix_similarity=min_similarity)
    selected = parse_devices(devices) if devices is not None else None
    inputs = _input_paths(base, new)
    if out is not None:  # refused now rather than after both analyses
        check_files(out, DIFF_FILES, kind="diff", names=DIFF_FILES, inputs=inputs)
    st = bl.open_store(catalog, store)
    opts = _options(samples_per_step, tokens_per_step, nsys)
    res = diff(bl.resolve(base, store=st, options=opts, role="BASE", devices=selected),
               bl.resolve(new, store=st, options=opts, role="NEW", devices=selected), params)
    if out is not None:
        write_diff(res, out, inputs=inputs)
    if as_json:
        click.echo(diff_json(res))
    else:
        for line in summary_lines(res):
            click.echo(line)
        if out is not None:
            click.echo(f"-> {out / 'diff.md'}")
    if fail_on_regression:
        if not res.comparable:
            sys.exit(EXIT_NOT_COMPARABLE)
        if res.counts()["regressed"]:
            sys.exit(EXIT_VIOLATED)


def parse_devices(text: str) -> tuple[int, ...]:
    """``--devices 0,1`` -> (0, 1); anything but distinct non-negative integers is a usage
    error."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise click.UsageError(f"--devices {text!r}: expected device ids, e.g. --devices 0 or "
                               "--devices 0,1")
    ids = tuple(int(p) for p in parts)
    if len(set(ids)) != len(ids):
        raise click.UsageError(f"--devices {text!r} names a device twice")
    return ids


@click.command("check")
@click.argument("trace")
@click.option("--budget", "budget_path", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="Budget file (TOML); see docs/budget.md.")
@click.option("--baseline", "baseline", default=None, metavar="NAME|DIR",
              help="Baseline for relative rules (default: `baseline` in the budget file).")
@click.option("--junit", "junit", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a JUnit XML report (one test case per rule).")
@click.option("--summary", "summary", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Append a Markdown summary (default: $GITHUB_STEP_SUMMARY "
              "when set).")
@_analysis_options
@_store_options
def check_cmd(trace: str, budget_path: Path, baseline: str | None, junit: Path | None,
              summary: Path | None, samples_per_step: float | None,
              tokens_per_step: float | None, nsys: Path | None, catalog: str | None,
              store: Path | None) -> None:
    """Check TRACE (a trace, an `analyze` output directory or a baseline name) against a
    budget. One line per rule; exit 0 when every rule holds, 3 when one is violated, 4 when
    a rule cannot be evaluated (not comparable)."""
    from nsysan.compare import baseline as bl
    from nsysan.compare import budget as bud
    from nsysan.compare.junit import append_summary, is_junit_report, step_summary, write_junit
    from nsysan.errors import ConfigError
    from nsysan.report.targets import check_file

    budget = bud.load(budget_path)  # invalid rules fail here, before any analysis
    base_arg = baseline or budget.baseline
    if budget.relative and base_arg is None:
        raise ConfigError(f"{budget_path}: rules compare with `baseline` but no baseline was "
                          "given: pass --baseline NAME|DIR or set baseline = \"NAME\" in the "
                          "budget")
    # the report files are checked now, before the analysis; neither may be an input
    inputs = [budget_path, *_input_paths(trace, base_arg)]
    summary_option = "--summary"
    if summary is None and os.environ.get("GITHUB_STEP_SUMMARY"):
        summary, summary_option = Path(os.environ["GITHUB_STEP_SUMMARY"]), "$GITHUB_STEP_SUMMARY"
    if junit is not None:
        check_file(junit, inputs=inputs, option="--junit", is_ours=is_junit_report)
    if summary is not None:
        check_file(summary, inputs=inputs, option=summary_option, appending=True)
    st = bl.open_store(catalog, store)
    opts = _options(samples_per_step, tokens_per_step, nsys)
    run = bl.resolve(trace, store=st, options=opts, role="TRACE")
    ref = bl.resolve(base_arg, store=st, options=opts, role="baseline") \
        if base_arg and budget.relative else None
    results = bud.evaluate(budget, run, ref)
    for r in results:
        click.echo(r.line())
    suite = Path(budget_path).stem
    if junit is not None:
        write_junit(junit, results, suite=suite, trace_id=run.trace_id, inputs=inputs)
    if summary is not None:
        append_summary(summary, step_summary(results, trace_id=run.trace_id,
                                             budget=str(budget_path), baseline=base_arg),
                       inputs=inputs, option=summary_option)
    code = bud.exit_code(results)
    if code:
        sys.exit(code)


@click.group("baseline")
def baseline_group() -> None:
    """Named baselines for `nsysan diff` and `nsysan check` (in the catalog when one is
    configured, else in a local directory)."""


@baseline_group.command("save")
@click.argument("name")
@click.argument("target")
@_analysis_options
@_store_options
def baseline_save(name: str, target: str, samples_per_step: float | None,
                  tokens_per_step: float | None, nsys: Path | None, catalog: str | None,
                  store: Path | None) -> None:
    """Save TARGET (a trace, an `analyze` output directory, or with a catalog the id of a
    trace it analysed) as baseline NAME (replacing one of that name)."""
    from nsysan.compare import baseline as bl

    rec = bl.open_store(catalog, store).save(
        name, target, _options(samples_per_step, tokens_per_step, nsys))
    click.echo(f"saved baseline {rec.name} ({rec.where}): {rec.trace_id} -> {rec.output_dir}")


@baseline_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_store_options
def baseline_list(as_json: bool, catalog: str | None, store: Path | None) -> None:
    """List the baselines."""
    from nsysan.compare import baseline as bl
    from nsysan.compare.render import fmt_value

    recs = bl.open_store(catalog, store).list()
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in recs], indent=2))
        return
    if not recs:
        click.echo("no baselines")
        return
    for r in recs:
        h = r.headline or {}
        click.echo(f"{r.name}\t{r.created_utc}\t{r.trace_id}\tstep "
                   f"{fmt_value(h.get('step_time_ns'), 'ns')}\tGPU busy "
                   f"{fmt_value(h.get('gpu_busy_frac'), 'frac')}")


@baseline_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_store_options
def baseline_show(name: str, as_json: bool, catalog: str | None, store: Path | None) -> None:
    """Show one baseline: where it is, what it holds, its headline metrics."""
    from nsysan.compare import baseline as bl
    from nsysan.compare.render import fmt_value
    from nsysan.errors import ConfigError

    st = bl.open_store(catalog, store)
    rec = st.get(bl.check_name(name))
    if rec is None:
        known = ", ".join(b.name for b in st.list()[:10]) or "none"
        raise ConfigError(f"no baseline {name!r} (baselines: {known})")
    ms = bl.load(rec)
    if as_json:
        click.echo(json.dumps({**rec.to_dict(), "info": ms.info.to_dict()}, indent=2,
                              default=str))
        return
    units = {"step_time_ns": "ns", "steps_per_s": "1/s", "gpu_busy_frac": "frac",
             "exposed_nccl_ns_per_step": "ns", "idle_ns_per_step": "ns"}
    click.echo(f"baseline {rec.name} ({rec.where}), saved {rec.created_utc}")
    click.echo(f"  trace:    {rec.trace_id}")
    click.echo(f"  from:     {rec.source}")
    click.echo(f"  analysis: {rec.output_dir}")
    click.echo(f"  steps:    {ms.info.n_steps} steady of {ms.info.n_steps_all} "
               f"({ms.info.steps_source or 'none'})")
    for key, value in ms.headline().items():
        click.echo(f"  {key}: {fmt_value(value, units[key])}")


@click.command("scaling")
@click.argument("runs", nargs=-1, required=True)
@click.option("-o", "--out", "out", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Write scaling.md, scaling.json, scaling*.parquet and "
              "scaling.png here.")
@click.option("--weak", is_flag=True, default=False,
              help="Weak scaling: constant work per GPU (efficiency = step-time ratio).")
@click.option("--samples-per-step", "samples", type=FINITE, multiple=True,
              help="Global samples per step of each run, once per RUN in order.")
@click.option("--tokens-per-step", "tokens", type=FINITE, multiple=True,
              help="Global tokens per step of each run, once per RUN in order.")
@click.option("--intra-node-gbps", type=FINITE, default=None,
              help="Rated per-GPU link bandwidth inside a node (default: nominal NVLink/PCIe "
              "of the GPU model).")
@click.option("--inter-node-gbps", type=FINITE, default=None,
              help="Rated per-GPU network bandwidth between nodes (e.g. 25 for one 200 Gb/s "
              "NIC per GPU); inter-node bandwidth is not judged without it.")
@click.option("--confidence", type=FINITE, default=0.95, show_default=True,
              help="Confidence of the efficiency interval.")
@click.option("--min-similarity", type=FINITE, default=0.5, show_default=True,
              help="Compute-kernel-mix similarity below which runs are different workloads.")
@click.option("--json", "as_json", is_flag=True, help="Print scaling.json instead of a summary.")
@click.option("--nsys", type=click.Path(path_type=Path), default=None,
              help="The nsys binary used to export .nsys-rep/.qdrep inputs.")
def scaling_cmd(runs: tuple[str, ...], out: Path | None, weak: bool, samples: tuple[float, ...],
                tokens: tuple[float, ...], intra_node_gbps: float | None,
                inter_node_gbps: float | None, confidence: float, min_similarity: float,
                as_json: bool, nsys: Path | None) -> None:
    """Where multi-GPU efficiency goes between scales of one job.

    Each RUN is one job at one scale: a folder of rank profiles, one multi-process profile,
    profiles joined by commas, or an analyze / batch output folder (its profiles are read
    again). Give the work per step of every run (--samples-per-step or
    --tokens-per-step, once per RUN) or --weak. Exit 4 when the runs are not comparable."""
    from nsysan.compare.scaling import ScalingParams, scaling
    from nsysan.compare.scaling_measure import LinkParams, expand_run, measure_run
    from nsysan.compare.scaling_render import (
        SCALING_FILES,
        scaling_json,
        summary_lines,
        write_scaling,
    )
    from nsysan.compare.stats import StatsParams
    from nsysan.report.targets import check_files

    if len(runs) < 2:
        raise click.UsageError("give at least two RUNs (one job at each scale)")
    if samples and tokens:
        raise click.UsageError("--samples-per-step and --tokens-per-step exclude each other")
    work = samples or tokens
    if work and weak:
        raise click.UsageError("--weak and a work per step exclude each other")
    if not work and not weak:
        raise click.UsageError("give --samples-per-step (or --tokens-per-step) once per RUN, "
                               "or --weak for constant work per GPU")
    if work and len(work) != len(runs):
        raise click.UsageError(f"{len(work)} work-per-step values for {len(runs)} RUNs: give "
                               "one per RUN, in order")
    link = LinkParams(intra_node_gbps=intra_node_gbps, inter_node_gbps=inter_node_gbps)
    params = ScalingParams(weak=weak, work_per_step=tuple(work) if work else None,
                           work_unit="tokens" if tokens else "samples",
                           stats=StatsParams(confidence=confidence),
                           min_kernel_mix_similarity=min_similarity, link=link)
    specs = [expand_run(r) for r in runs]  # an unusable RUN fails now, before any analysis
    inputs = _input_paths(*(p for r in runs for p in r.split(",")),
                          *(p for spec in specs for p in spec))
    if out is not None:
        check_files(out, SCALING_FILES, kind="scaling", names=SCALING_FILES, inputs=inputs)
    measured = [measure_run(spec, label=r, link=link, nsys=str(nsys) if nsys else None)
                for r, spec in zip(runs, specs, strict=True)]
    res = scaling(measured, params)
    if out is not None:
        write_scaling(res, out, inputs=inputs)
    if as_json:
        click.echo(scaling_json(res))
    else:
        for line in summary_lines(res):
            click.echo(line)
        if out is not None:
            click.echo(f"-> {out / 'scaling.md'}")
    if not res.comparable:
        sys.exit(EXIT_NOT_COMPARABLE)
