"""Comparing runs and gating CI: the metric model, statistics, decomposition, ``nsysan diff``,
budgets for ``nsysan check`` and named baselines (docs/diff.md, docs/budget.md).

    from nsysan.compare import metrics, diff
    res = diff.diff(metrics.from_dir("out/main"), metrics.from_result(analyze("new.sqlite")))
"""
