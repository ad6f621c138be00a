"""The layers of nsysan import downwards only (issue 17; docs/architecture.md):

    core (errors, escape, _version, model, allocator) < testing < frames < load < passes < findings
    < report < api < batch < multirank < compare < evaluation < nsysan (the package facade)
    < cli

A module may import its own layer and the layers below; the library never imports the CLI.
Pure AST (no import-linter dependency): every ``import``/``from`` of an nsysan module,
module-level or inside a function, counts. ``batch`` sits below multirank and compare because
both may keep their results in its catalogue; ``compare`` sits above ``multirank`` because
`nsysan scaling` compares whole jobs; ``evaluation`` (the scored corpus) drives whole analyses.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nsysan"
#: layer of a module: the first component below ``nsysan`` (a module's own name for top-level
#: modules), mapped to a rank; two layers of one rank may not import each other
RANK = {
    "errors": 0, "escape": 0, "_version": 0, "model": 0, "allocator": 0,
    "testing": 1,
    "frames": 2,
    "load": 3,
    "passes": 4,
    "findings": 5,
    "report": 6,
    "api": 7,
    "batch": 8,
    "multirank": 9,
    "compare": 10,
    "evaluation": 11,
    "": 12,  # nsysan/__init__.py: the public facade
    "cli": 13,  # cli*.py and __main__.py
}


def _layer(module: str) -> str:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else ""
    return "cli" if name == "__main__" or name.startswith("cli") else name


def _module_of(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _submodules(root: Path = PACKAGE) -> set[str]:
    return {_module_of(p, root) for p in root.rglob("*.py")}


def imports(path: Path, known: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` for every nsysan module ``path`` imports; ``from nsysan import x``
    is module ``nsysan.x`` when that is a module, else the package facade ``nsysan``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "nsysan"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "nsysan":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((node.lineno, sub if sub in known else node.module))
    return out


def violations(root: Path = PACKAGE) -> list[str]:
    known = _submodules(root)
    bad = []
    for path in sorted(root.rglob("*.py")):
        me = _module_of(path, root)
        mine = RANK[_layer(me)]
        for line, target in imports(path, known):
            theirs = RANK[_layer(target)]
            same_layer = _layer(target) == _layer(me)
            if theirs > mine or (theirs == mine and not same_layer):
                bad.append(f"{me}:{line} imports {target} ({_layer(me) or 'nsysan'} may not "
                           f"import {_layer(target) or 'the package facade'})")
    return bad


def test_every_layer_is_ranked():
    layers = {_layer(m) for m in _submodules()}
    assert layers <= RANK.keys(), f"rank the new layer(s): {sorted(layers - RANK.keys())}"


def test_imports_go_downwards_only():
    assert violations() == []


def test_the_library_never_imports_the_cli():
    cli = {k for k, r in RANK.items() if r == RANK["cli"]}
    known = _submodules()
    for path in PACKAGE.rglob("*.py"):
        me = _module_of(path)
        if _layer(me) in cli:
            continue
        assert not [t for _, t in imports(path, known) if _layer(t) in cli], me


def test_the_check_sees_an_upward_import(tmp_path):
    pkg = tmp_path / "nsysan"
    (pkg / "frames").mkdir(parents=True)
    (pkg / "passes").mkdir()
    (pkg / "frames" / "x.py").write_text("def f():\n    from nsysan.passes import y\n")
    (pkg / "passes" / "y.py").write_text("from nsysan.frames import x\n")
    (pkg / "multirank.py").write_text("import nsysan.compare.z\n")
    assert violations(pkg) == [
        "nsysan.frames.x:2 imports nsysan.passes.y (frames may not import passes)",
        "nsysan.multirank:1 imports nsysan.compare.z (multirank may not import compare)",
    ]
