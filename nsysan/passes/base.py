"""What every pass is: a pure function (trace, params, earlier results) -> PassResult."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from nsysan.frames.trace import Trace

# The core types, re-exported: they live in `nsysan.model` now.
from nsysan.model import LAYERS as LAYERS
from nsysan.model import SEVERITIES as SEVERITIES
from nsysan.model import Finding as Finding
from nsysan.model import PassResult as PassResult
from nsysan.model import Results as Results

PassFn = Callable[[Trace, Any, Results], PassResult]


@dataclass(frozen=True)
class PassSpec:
    """A registered pass.

    ``params`` is a frozen dataclass type whose defaults are the pass defaults; ``tables`` maps
    each output table to its schema (declared in the pass's module, or in
    `nsysan.frames.schemas` for the first passes); ``requires`` names passes whose results
    ``run`` reads (they run first; ``after`` names passes used only when they are also
    selected); ``default``: run by ``nsysan analyze`` when ``--passes`` is not given; ``auto``:
    a probe of the trace for a pass that is not a default one: it joins the default passes of
    a trace the probe finds its input in (or when ``--set`` configures it), so a trace without
    that input keeps exactly the outputs it had before the pass existed. ``releases`` names
    canonical frames that nothing reads after the passes (the findings and reports read the
    pass tables and shared products): when the caller asks for it (`schedule.run_passes`),
    they are released from the trace once this pass and every other selected pass naming
    them have ended. ``frees`` names the shared products this pass takes over as their last
    user (``keep=False``: they are freed when it ends). Passes that release frames or free
    products start as early as their dependencies allow (`schedule.run_order`).

    A module of `nsysan.passes` that defines ``SPEC`` is a pass (`registry.registry`): adding
    a pass is adding its module.
    """

    name: str
    description: str
    params: type
    tables: Mapping[str, pl.Schema]
    run: PassFn
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    default: bool = False
    auto: Callable[[Any], bool] | None = None
    releases: tuple[str, ...] = ()
    frees: tuple[str, ...] = ()
