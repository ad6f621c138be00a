"""Synthetic pairs of runs for the diff / budget / baseline tests, built and analysed once per
test session (module-level cache keyed by pair kind)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsysan.api import analyze
from nsysan.compare import metrics as M
from nsysan.compare.inputs import RunData
from nsysan.testing import pairs

MAKERS = {
    "exposed_allreduce": pairs.exposed_allreduce_pair,
    "data_loader": pairs.data_loader_pair,
    "jitter": pairs.jitter_pair,
}


@dataclass
class Pair:
    base_path: Path
    new_path: Path
    truth: pairs.PairTruth
    base_result: Any
    new_result: Any

    @property
    def base(self) -> M.MetricSet:
        return M.from_result(self.base_result)

    @property
    def new(self) -> M.MetricSet:
        return M.from_result(self.new_result)

    def base_run(self) -> RunData:
        return RunData.from_result(self.base_result)

    def new_run(self) -> RunData:
        return RunData.from_result(self.new_result)


_CACHE: dict[str, Pair] = {}


def get(kind: str, root: Path) -> Pair:
    if kind not in _CACHE:
        b, n, truth = MAKERS[kind](root / kind)
        _CACHE[kind] = Pair(b, n, truth, analyze(b), analyze(n))
    return _CACHE[kind]
