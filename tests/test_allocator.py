"""nsysan tunes polars' jemalloc before polars is imported, and only then (`nsysan.allocator`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nsysan import allocator

SHOW = "import {first}os; print(os.environ.get('_RJEM_MALLOC_CONF', '<unset>'))"


def _child(code: str, env_value: str | None = None) -> str:
    """What a new interpreter running ``code`` prints, with ``_RJEM_MALLOC_CONF`` unset or
    set to ``env_value`` (the test process's own value, which polars set, is not passed on)."""
    env = {k: v for k, v in os.environ.items() if k != allocator.JEMALLOC_ENV}
    if env_value is not None:
        env[allocator.JEMALLOC_ENV] = env_value
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip()


def test_importing_nsysan_first_sets_the_decay_after_polars_defaults():
    value = _child(SHOW.format(first="nsysan, "))
    # polars puts its defaults first and appends ours: jemalloc takes the last of each key
    assert value.endswith("," + allocator.DECAY)
    assert value.index("dirty_decay_ms:500") < value.index(allocator.DECAY)


def test_a_users_own_settings_are_left_alone():
    value = _child(SHOW.format(first="nsysan, "), env_value="dirty_decay_ms:2000")
    assert value.endswith(",dirty_decay_ms:2000")
    assert allocator.DECAY not in value


def test_nothing_is_set_once_polars_is_imported():
    value = _child(SHOW.format(first="polars, nsysan, "))
    assert value != "<unset>"  # polars' own defaults
    assert allocator.DECAY not in value


def test_the_commands_entry_point_sets_the_decay():
    # what the ``nsysan`` console script imports first
    code = "from nsysan.cli import main; import os; print(os.environ['_RJEM_MALLOC_CONF'])"
    assert _child(code).endswith(allocator.DECAY)


def test_tune_returns_whether_it_set_the_variable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(allocator.JEMALLOC_ENV, raising=False)
    assert not allocator.tune_polars_allocator()  # polars is imported in this process
    monkeypatch.delitem(sys.modules, "polars")
    assert allocator.tune_polars_allocator()
    assert os.environ[allocator.JEMALLOC_ENV] == allocator.DECAY
    assert not allocator.tune_polars_allocator()  # set now: left alone
