"""The pass registry: every pass module's SPEC, in dependency order, and parameter handling."""

from __future__ import annotations

import dataclasses
import importlib
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from nsysan.errors import ConfigError
from nsysan.passes.base import PassSpec

#: Modules whose ``SPEC`` is a pass. Order is only a tie-break: dependencies decide first.
PASS_MODULES = (
    "steps",
    "gaps",
    "overlap",
    "attribution",
    "kernels",
    "nccl",
    "memory",
)

#: Passes run by ``nsysan analyze`` when ``--passes`` is not given.
DEFAULT_PASSES = ("steps", "gaps", "overlap", "attribution", "kernels", "nccl")
#: Passes added to the default ones when the trace has what they read (`auto_passes`): a
#: trace without it keeps exactly the outputs (manifest included) it had before they existed.
AUTO_PASSES = ("memory",)


def auto_passes(trace: Any, settings: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The default passes for ``trace``: `DEFAULT_PASSES`, plus each of `AUTO_PASSES` whose
    input the trace holds (memory: CUDA memory-usage events) or that ``settings`` configure;
    without a trace (None), only the configured ones."""
    from nsysan.passes.memory import has_events

    probes = {"memory": has_events}
    named = {k.partition(".")[0] for k in (settings or {})}
    extra = tuple(p for p in AUTO_PASSES
                  if p in named or (trace is not None and probes[p](trace)))
    return (*DEFAULT_PASSES, *extra)


def registry() -> dict[str, PassSpec]:
    """All registered passes by name (modules that are not installed are skipped)."""
    specs: dict[str, PassSpec] = {}
    for mod_name in PASS_MODULES:
        try:
            mod = importlib.import_module(f"nsysan.passes.{mod_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"nsysan.passes.{mod_name}":
                continue
            raise
        spec: PassSpec = mod.SPEC
        specs[spec.name] = spec
    return specs


def resolve(selected: Iterable[str] | None) -> list[PassSpec]:
    """The passes to run, with every required pass added, in dependency order."""
    specs = registry()
    wanted = list(selected) if selected else [p for p in DEFAULT_PASSES if p in specs]
    unknown = [p for p in wanted if p not in specs]
    if unknown:
        raise ConfigError(
            f"unknown pass {', '.join(map(repr, unknown))}; available: {', '.join(specs)}"
        )
    chosen: set[str] = set()

    def add(name: str) -> None:
        if name in chosen:
            return
        chosen.add(name)
        for dep in specs[name].requires:
            add(dep)

    for name in wanted:
        add(name)
    ordered: list[PassSpec] = []
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...] = ()) -> None:
        if name in done:
            return
        if name in stack:
            raise ConfigError(f"pass dependency cycle: {' -> '.join((*stack, name))}")
        spec = specs[name]
        for dep in (*spec.requires, *(a for a in spec.after if a in chosen)):
            visit(dep, (*stack, name))
        done.add(name)
        ordered.append(spec)

    for name in [m for m in PASS_MODULES if m in chosen]:
        visit(name)
    return ordered


def _coerce(value: str, annotation: Any, where: str) -> Any:
    """Turn a ``--set`` string into the type a params field declares."""
    if isinstance(annotation, str):
        annotation = eval(annotation, {"tuple": tuple, "str": str, "int": int, "float": float,
                                       "bool": bool, "None": None})
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value.lower() in ("none", "null", ""):
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if origin is tuple:
        inner = args[0] if args else str
        return tuple(_coerce(v.strip(), inner, where) for v in value.split(",") if v.strip())
    try:
        if annotation is bool:
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if annotation in (int, float):
            number = float(value) if annotation is float or "e" in value.lower() else None
            if number is not None and not math.isfinite(number):
                raise ConfigError(f"{where}: {value!r} is not a finite number")
            if annotation is float:
                return number
            return int(number) if number is not None else int(value.replace("_", ""))
    except ValueError:
        raise ConfigError(f"{where}: cannot read {value!r} as {annotation.__name__}") from None
    return value


def build_params(
    specs: Iterable[PassSpec], settings: Mapping[str, str] | None
) -> dict[str, Any]:
    """Params instance per pass from ``{"gaps.min_gap_ns": "500000", ...}`` settings."""
    specs = list(specs)
    by_name = {s.name: s for s in specs}
    overrides: dict[str, dict[str, Any]] = {s.name: {} for s in specs}
    all_specs = registry()
    for key, raw in (settings or {}).items():
        pass_name, _, field = key.partition(".")
        if not field:
            raise ConfigError(
                f"--set {key}={raw}: expected PASS.PARAM=VALUE, e.g. gaps.min_gap_ns=500000"
            )
        if pass_name not in all_specs:
            raise ConfigError(
                f"--set {key}: unknown pass {pass_name!r}; available: {', '.join(all_specs)}"
            )
        if pass_name not in by_name:
            raise ConfigError(f"--set {key}: pass {pass_name!r} is not selected (see --passes)")
        fields = {f.name: f for f in dataclasses.fields(by_name[pass_name].params)}
        if field not in fields:
            raise ConfigError(
                f"--set {key}: pass {pass_name!r} has no parameter {field!r}; "
                f"parameters: {', '.join(fields) or 'none'}"
            )
        overrides[pass_name][field] = _coerce(raw, fields[field].type, f"--set {key}")
    params: dict[str, Any] = {}
    for spec in specs:
        try:
            params[spec.name] = spec.params(**overrides[spec.name])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"parameters of pass {spec.name!r}: {exc}") from None
    return params


def describe() -> list[dict[str, Any]]:
    """Passes, their parameters with defaults and their output tables (for ``nsysan passes``)."""
    out = []
    for spec in registry().values():
        out.append(
            {
                "name": spec.name,
                "description": spec.description,
                "params": {
                    f.name: (f.default if f.default is not dataclasses.MISSING
                             else f.default_factory())  # type: ignore[misc]
                    for f in dataclasses.fields(spec.params)
                },
                "tables": list(spec.tables),
                "requires": list(spec.requires),
                "default": spec.name in DEFAULT_PASSES,
            }
        )
    return out
