"""No module-level mutable state in nsysan (issue 17): what an analysis shares lives in its
`AnalysisContext`, not in module globals that outlive it.

Checked on the source (AST), so a new cache is caught when it is written, not when it leaks:

- no ``global`` statement anywhere;
- a module-level container (dict/list/set literal or comprehension, or a call of dict, list,
  set, defaultdict, deque, Counter, OrderedDict, a weak container or a lock) is allowed only
  as a *constant table*: ``__all__``, or an UPPER_CASE name that no code in the package ever
  mutates (item assignment or deletion, augmented assignment, or a mutating method call on
  that name). Tuples, frozensets and ``MappingProxyType`` are constants by construction.
- a module-level instance of a class defined in nsysan must be of a frozen dataclass (a
  ``SPEC``, a `Product`): an object with a memo inside is a cache all the same;
- `ALLOWED`: the few process-wide services that are state by nature, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nsysan"
_CONTAINER_CALLS = frozenset({
    "dict", "list", "set", "defaultdict", "deque", "Counter", "OrderedDict",
    "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "Lock", "RLock"})
_MUTATORS = frozenset({
    "append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear",
    "remove", "add", "discard", "appendleft", "popleft", "sort", "reverse"})
#: module -> name -> why it is module state
ALLOWED = {
    "nsysan/load/cache.py": {
        "_executor": "the one background thread that writes frame cache files for the "
                     "process (`flush` waits for it before exit); holds no trace data",
        "_pending": "the cache writes queued on that thread, drained by `flush`",
    },
    "nsysan/cli_types.py": {
        "FINITE": "a click parameter type (stateless; click wants an instance)",
    },
    "nsysan/report/manifest.py": {
        "_PENDING": "input hashes started early for the manifest of this process, keyed by "
                    "the exact file version and consumed once (`sha256_file`)",
        "_PENDING_LOCK": "guards _PENDING (hashes run in a daemon thread)",
    },
}


def _modules() -> list[tuple[str, ast.Module]]:
    root = PACKAGE.parent
    return [(p.relative_to(root).as_posix(), ast.parse(p.read_text(encoding="utf-8")))
            for p in sorted(PACKAGE.rglob("*.py"))]


def _container(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                          ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        return name in _CONTAINER_CALLS
    return False


def _target_names(node: ast.stmt) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]  # type: ignore[attr-defined]
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _base(node: ast.expr) -> tuple[str, bool] | None:
    """``(X, qualified)`` of ``X``, ``mod.X``, ``X[...]``: the name a mutation acts on, and
    whether it was reached through a module (``mod.X``: any module's X)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, False
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr, True
    return None


def _mutations(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names mutated after import (inside a function), bare and through a module. What a
    module does to its own tables while it is imported is how it builds them."""
    bare: set[str] = set()
    qualified: set[str] = set()
    functions = [n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for node in (m for f in functions for m in ast.walk(f)):
        acted: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            acted = [t for t in node.targets if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.AugAssign):
            acted = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _MUTATORS):
            acted = [node.func.value]
        for t in acted:
            found = _base(t)
            if found:
                (qualified if found[1] else bare).add(found[0])
    return bare, qualified


def _classes(modules: list[tuple[str, ast.Module]]) -> dict[str, bool]:
    """Class name -> whether it is a frozen dataclass, for every class nsysan defines."""
    out: dict[str, bool] = {}
    for _, tree in modules:
        for n in ast.walk(tree):
            if isinstance(n, ast.ClassDef):
                out[n.name] = any(
                    isinstance(d, ast.Call) and any(
                        k.arg == "frozen" and getattr(k.value, "value", False)
                        for k in d.keywords)
                    for d in n.decorator_list)
    return out


def _called(value: ast.expr | None) -> str:
    if not isinstance(value, ast.Call):
        return ""
    f = value.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def module_state_violations(modules: list[tuple[str, ast.Module]]) -> list[str]:
    frozen = _classes(modules)
    found = {path: _mutations(tree) for path, tree in modules}
    through_modules = {n for _, q in found.values() for n in q}
    bad = []
    for path, tree in modules:
        allowed = ALLOWED.get(path, {})
        mutated = found[path][0] | through_modules
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                names = [n for n in node.names if n not in allowed]
                if names:
                    bad.append(f"{path}:{node.lineno}: global {', '.join(names)}")
        for node in tree.body:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            cls = _called(node.value)
            if cls in frozen and not frozen[cls]:
                bad += [f"{path}:{node.lineno}: module-level {name} (a {cls}, not frozen)"
                        for name in _target_names(node) if name not in allowed]
                continue
            if not _container(node.value):
                continue
            for name in _target_names(node):
                if name in allowed or name == "__all__":
                    continue
                constant = name.lstrip("_").isupper() and name not in mutated
                if not constant:
                    why = "mutated" if name in mutated else "not an UPPER_CASE constant"
                    bad.append(f"{path}:{node.lineno}: module-level {name} ({why})")
    return bad


def test_the_package_has_no_module_level_mutable_state():
    assert module_state_violations(_modules()) == []


def test_every_allowed_name_still_exists():
    """A stale allow-list entry would hide a new variable of the same name later."""
    modules = dict(_modules())
    for path, names in ALLOWED.items():
        defined = {n for node in modules[path].body if isinstance(node, (ast.Assign,
                                                                       ast.AnnAssign))
                   for n in _target_names(node)}
        assert set(names) <= defined, path


def test_the_check_catches_caches_and_globals():
    src = '''
import weakref
class Memo:
    pass
_CACHE = {}
_SEEN: weakref.WeakSet = weakref.WeakSet()
TABLE = {"a": 1}
memo = []
_MEMO = Memo()
def f(x):
    global COUNT
    _CACHE[x] = 1
    _SEEN.add(x)
    return TABLE["a"]
'''
    bad = module_state_violations([("nsysan/x.py", ast.parse(src))])
    assert bad == [
        "nsysan/x.py:11: global COUNT",
        "nsysan/x.py:5: module-level _CACHE (mutated)",
        "nsysan/x.py:6: module-level _SEEN (mutated)",
        "nsysan/x.py:8: module-level memo (not an UPPER_CASE constant)",
        "nsysan/x.py:9: module-level _MEMO (a Memo, not frozen)",
    ]
