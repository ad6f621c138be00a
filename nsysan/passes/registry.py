"""The pass registry: every pass module's SPEC, in dependency order, and parameter handling."""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from nsysan.errors import ConfigError
from nsysan.passes.base import PassSpec

#: Packages searched for passes: every module of theirs that defines a ``SPEC`` is a pass.
PASS_PACKAGES = ("nsysan.passes",)
#: Tie-break of the run order among passes whose dependencies allow either order (the order
#: of the first passes, kept so their outputs and timings list in the order they always did);
#: other passes follow, by module name.
TIE_BREAK = ("steps", "gaps", "overlap", "attribution", "kernels", "nccl")


def _pass_modules() -> list[Any]:
    """The modules of `PASS_PACKAGES` that define a ``SPEC``, in `TIE_BREAK` order, then by
    name. A module that a build left out is skipped; any other import error is raised."""
    found: dict[str, Any] = {}
    for package in PASS_PACKAGES:
        pkg = importlib.import_module(package)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            if info.ispkg or info.name.startswith("_"):
                continue
            full = f"{package}.{info.name}"
            try:
                mod = importlib.import_module(full)
            except ModuleNotFoundError as exc:
                if exc.name == full:
                    continue
                raise
            if isinstance(getattr(mod, "SPEC", None), PassSpec):
                found.setdefault(info.name, mod)
    rank = {n: i for i, n in enumerate(TIE_BREAK)}
    return [found[n] for n in sorted(found, key=lambda n: (rank.get(n, len(rank)), n))]


def auto_passes(trace: Any, settings: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The default passes for ``trace``: `default_passes`, plus each pass with an ``auto``
    probe (`PassSpec.auto`) that finds its input in the trace or that ``settings``
    configure; without a trace (None), only the configured ones."""
    named = {k.partition(".")[0] for k in (settings or {})}
    extra = tuple(name for name, spec in registry().items()
                  if not spec.default and spec.auto is not None
                  and (name in named or (trace is not None and spec.auto(trace))))
    return (*default_passes(), *extra)


def registry() -> dict[str, PassSpec]:
    """All registered passes by name, in tie-break order (see `_pass_modules`)."""
    specs: dict[str, PassSpec] = {}
    for mod in _pass_modules():
        spec: PassSpec = mod.SPEC
        if spec.name in specs:
            raise ConfigError(f"two passes are named {spec.name!r} "
                              f"({specs[spec.name].run.__module__}, {mod.__name__})")
        specs[spec.name] = spec
    return specs


def default_passes() -> tuple[str, ...]:
    """Passes run by ``nsysan analyze`` when ``--passes`` is not given: those whose SPEC says
    ``default=True``."""
    return tuple(name for name, spec in registry().items() if spec.default)


def __getattr__(name: str) -> Any:
    # DEFAULT_PASSES was a constant tuple: still readable, now found from the SPECs
    if name == "DEFAULT_PASSES":
        return default_passes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve(selected: Iterable[str] | None) -> list[PassSpec]:
    """The passes to run, with every required pass added, in dependency order."""
    specs = registry()
    wanted = (list(selected) if selected
              else [name for name, spec in specs.items() if spec.default])
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

    for name in [m for m in specs if m in chosen]:
        visit(name)
    return ordered


def _coerce(value: str, annotation: Any, where: str) -> Any:
    """Turn a ``--set`` string into the type a params field declares."""
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
    specs: Iterable[PassSpec], settings: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Params instance per pass from settings: ``{"gaps.min_gap_ns": "500000", ...}`` as
    ``--set`` gives them (strings, read as the declared type), typed values
    (``{"gaps.min_gap_ns": 500000}``, taken as they are), or a whole params object of a pass
    (``{"gaps": GapsParams(min_gap_ns=500000)}``)."""
    specs = list(specs)
    by_name = {s.name: s for s in specs}
    overrides: dict[str, dict[str, Any]] = {s.name: {} for s in specs}
    whole: dict[str, Any] = {}
    all_specs = registry()
    for key, raw in (settings or {}).items():
        pass_name, _, field = key.partition(".")
        if pass_name == "findings" and field:  # finding thresholds: nsysan.findings.params
            continue
        if not field and pass_name in by_name and isinstance(raw, by_name[pass_name].params):
            whole[pass_name] = raw
            continue
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
        # the declared type, resolved (params modules use postponed annotations: strings)
        hint = typing.get_type_hints(by_name[pass_name].params)[field]
        overrides[pass_name][field] = (_coerce(raw, hint, f"--set {key}")
                                       if isinstance(raw, str) else raw)
    params: dict[str, Any] = {}
    for spec in specs:
        try:
            base = whole.get(spec.name)
            params[spec.name] = (spec.params(**overrides[spec.name]) if base is None
                                 else dataclasses.replace(base, **overrides[spec.name]))
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
                "default": spec.default,
            }
        )
    return out
