"""The precompiled rule data (rules/cache.py): keyed by content, stored where it can be, never required."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT
from torchdoctor.rules import cache


def counting_build(calls: list[int], value: object):
    def build():
        calls.append(1)
        return value

    return build


def test_built_once_then_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", str(tmp_path / "c"))
    source = tmp_path / "data.toml"
    source.write_text("a = 1\n")
    calls: list[int] = []
    assert cache.cached("data", [source], counting_build(calls, {"a": (1, 2)})) == {"a": (1, 2)}
    assert cache.cached("data", [source], counting_build(calls, {"a": "stale"})) == {"a": (1, 2)}
    assert len(calls) == 1


def test_an_edit_that_keeps_size_and_mtime_is_not_served_stale(tmp_path, monkeypatch):
    """The key is the content, not the mtime: a checkout or a copy that preserves times still rebuilds."""
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", str(tmp_path / "c"))
    source = tmp_path / "data.toml"
    source.write_text("a = 1\n")
    st = source.stat()
    calls: list[int] = []
    cache.cached("data", [source], counting_build(calls, "old"))
    source.write_text("a = 2\n")
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.cached("data", [source], counting_build(calls, "new")) == "new"
    assert len(calls) == 2
    assert [p.name.split(".")[0] for p in (tmp_path / "c").iterdir()] == ["data"]  # the old copy is gone


def test_an_unwritable_cache_directory_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", str(blocker / "cache"))
    source = tmp_path / "data.toml"
    source.write_text("a = 1\n")
    calls: list[int] = []
    for _ in range(2):
        assert cache.cached("data", [source], counting_build(calls, 7)) == 7
    assert len(calls) == 2


def test_caching_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDOCTOR_CACHE_DIR", "off")
    source = tmp_path / "data.toml"
    source.write_text("a = 1\n")
    calls: list[int] = []
    cache.cached("data", [source], counting_build(calls, 1))
    cache.cached("data", [source], counting_build(calls, 1))
    assert len(calls) == 2


def test_the_default_is_the_user_cache_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHDOCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.directories()[0] == tmp_path / "torchdoctor"
    assert cache.directories()[-1] == cache.PACKAGE_DIR


def test_ask_precompiles_into_the_user_cache_even_without_bytecode(tmp_path):
    """A read-only install (or PYTHONDONTWRITEBYTECODE) still gets a cache: in the user's cache directory."""
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "NO_COLOR": "1",
    }
    env.pop("TORCHDOCTOR_CACHE_DIR", None)
    cmd = [sys.executable, "-m", "torchdoctor.cli", "ask", "--format", "json", "loss is nan after epoch 3"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    stored = sorted(p.name.split(".")[0] for p in (tmp_path / "torchdoctor").iterdir())
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout
    assert {"phrases", "routing", "signatures", "symptoms", "vocabulary"} <= set(stored)
