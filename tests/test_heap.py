"""The C heap's freed memory goes back to the system after every pass and finding rule, and the
``nsysan`` command's threads share one glibc arena (`nsysan.frames.heap`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from findings_cases import scenario

from nsysan.findings import diagnose
from nsysan.findings import rules as rules_module
from nsysan.frames import heap
from nsysan.frames.trace import Trace, TraceMeta
from nsysan.passes import schedule
from nsysan.passes.base import PassResult, PassSpec
from nsysan.passes.schedule import run_passes

GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None

# glibc lists its arenas ("Arena N:" per arena, on stderr) before and while four new threads
# allocate at the same time: each new thread gets an arena of its own unless they are limited.
ARENAS = """
import ctypes, sys, threading
from nsysan.frames import heap
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc_stats()
print(heap.share_one_arena() if sys.argv[1] == "share" else "-", flush=True)
sys.stderr.write("--\\n")
sys.stderr.flush()
ready, done = threading.Barrier(5), threading.Event()
def work():
    libc.malloc(1 << 16)
    ready.wait()
    done.wait()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
ready.wait()
libc.malloc_stats()
done.set()
"""


def _arenas(mode: str, env: dict[str, str] | None = None) -> tuple[str, int, int]:
    """What the child said, and how many arenas it had before and after its threads."""
    child_env = {k: v for k, v in os.environ.items() if k != heap.ARENA_ENV} | (env or {})
    done = subprocess.run([sys.executable, "-c", ARENAS, mode], env=child_env,
                          capture_output=True, text=True, check=True, timeout=60)
    before, after = done.stderr.split("--\n")
    count = [len(re.findall(r"^Arena \d+:", text, re.M)) for text in (before, after)]
    return done.stdout.strip(), count[0], count[1]


@pytest.mark.skipif(not GLIBC, reason="glibc's arenas")
def test_threads_started_after_sharing_one_arena_make_no_arena_of_their_own() -> None:
    """(the imports' threads made some already: those are shared from then on)"""
    said, before, after = _arenas("keep")
    assert said == "-" and after == before + 4
    said, before, after = _arenas("share")
    # (glibc ignores the limit once more than 8 arenas exist: the imports must stay below)
    assert said == "True" and after == before and before <= 8


@pytest.mark.skipif(not GLIBC, reason="glibc's arenas")
def test_a_users_arena_setting_is_left_alone() -> None:
    said, before, after = _arenas("share", {heap.ARENA_ENV: "2"})
    assert said == "False" and before == after == 2
    said, before, after = _arenas("share", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert said == "False" and before == after == 2


class _Libc:
    """What `heap` calls of the C library, recorded (``names``: the functions it has)."""

    def __init__(self, names: tuple[str, ...] = ("malloc_trim", "mallopt")):
        self.calls: list[tuple] = []
        for name in names:
            setattr(self, name, lambda *args, name=name: self.calls.append((name, *args)) or 1)


def _values(call: tuple) -> tuple:
    return tuple(getattr(a, "value", a) for a in call)


def test_trim_asks_the_c_library_for_everything_free(monkeypatch) -> None:
    libc = _Libc()
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    heap.trim()
    assert [_values(c) for c in libc.calls] == [("malloc_trim", 0)]


def test_sharing_one_arena_sets_the_arena_limit_to_one(monkeypatch) -> None:
    monkeypatch.delenv(heap.ARENA_ENV, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    libc = _Libc()
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    assert heap.share_one_arena() is True
    assert libc.calls == [("mallopt", -8, 1)]


@pytest.mark.parametrize("names", [(), ("mallopt",)], ids=["no-libc-functions", "not-glibc"])
def test_without_glibc_nothing_is_called(monkeypatch, names: tuple[str, ...]) -> None:
    """musl has mallopt but no malloc_trim; elsewhere `_libc` may have neither."""
    monkeypatch.delenv(heap.ARENA_ENV, raising=False)
    libc = _Libc(names)
    monkeypatch.setattr(heap, "_libc", lambda: libc)
    heap.trim()
    assert heap.share_one_arena() is False
    assert libc.calls == []


def test_the_command_shares_one_arena_before_it_runs(monkeypatch) -> None:
    """``nsysan``'s entry point asks for one arena before the command (whose process then
    ends: not run here); importing nsysan does not (`_arenas("keep")` above imports it)."""
    import nsysan.cli as cli

    calls: list[str] = []
    monkeypatch.setattr(cli, "share_one_arena", lambda: calls.append("arena"))
    monkeypatch.setattr(cli, "cli", lambda **kw: calls.append("command"))
    monkeypatch.setattr(cli, "_exit", lambda status: calls.append(f"exit {status}"))
    cli.main()
    assert calls == ["arena", "command", "exit 0"]


@dataclass(frozen=True)
class _NoParams:
    pass


@pytest.mark.parametrize("workers", [1, 2])
def test_every_pass_returns_the_freed_heap_when_it_ends(monkeypatch, workers: int) -> None:
    log: list[str] = []
    monkeypatch.setattr(schedule, "trim", lambda: log.append("trim"))

    def body(name: str):
        def run(trace, params, prior) -> PassResult:
            log.append(name)
            return PassResult()
        return run

    specs = [PassSpec(name=n, description=n, params=_NoParams, tables={}, run=body(n),
                      after=after) for n, after in (("a", ()), ("b", ("a",)), ("c", ("b",)))]
    meta = TraceMeta(trace_id="t", path=Path("t"), source_path=Path("t"),
                     source_format="sqlite", tables={"CUPTI_ACTIVITY_KIND_KERNEL": 10})
    run_passes(specs, Trace(meta, lambda name: pl.DataFrame()),
               {s.name: _NoParams() for s in specs}, workers)
    assert log == ["a", "trim", "b", "trim", "c", "trim"]


def test_every_rule_returns_the_freed_heap_however_it_ends(monkeypatch) -> None:
    """A trim after each rule run: one that found something, nothing, or could not judge."""
    log: list[str] = []
    monkeypatch.setattr(rules_module, "trim", lambda: log.append("trim"))

    def logged(code: str, rule):
        def run(ctx):
            log.append(code)
            return rule(ctx)
        return run

    monkeypatch.setattr(rules_module, "RULES", {code: logged(code, rule)
                                                 for code, rule in rules_module.RULES.items()})
    d = diagnose(*scenario("starved_input"))
    assert d.findings and d.not_found and d.unavailable  # every way a rule ends
    ran = log[::2]
    assert len(ran) >= len(d.not_found) + len(d.unavailable) + 1
    assert log[1::2] == ["trim"] * len(ran) and len(log) == 2 * len(ran)
