"""`python -m bench`: names first, then the named benchmark's own flags and their values."""

from __future__ import annotations

import sys
import types

import bench.__main__ as dispatch


def fake_benchmarks(monkeypatch) -> list[str]:
    ran: list[str] = []
    for name in ("one", "two"):
        module = types.ModuleType(f"bench.fake_{name}")
        module.main = lambda name=name: ran.append(name) or 0
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(dispatch, "BENCHMARKS", {"one": "bench.fake_one", "two": "bench.fake_two"})
    return ran


def test_a_flag_value_is_the_benchmarks_not_a_benchmark_name(monkeypatch):
    ran = fake_benchmarks(monkeypatch)
    assert dispatch.main(["two", "--size", "20000", "--skip-standalone"]) == 0
    assert ran == ["two"]


def test_names_run_in_order_and_none_means_all(monkeypatch):
    ran = fake_benchmarks(monkeypatch)
    assert dispatch.main(["two", "one"]) == 0
    assert dispatch.main([]) == 0
    assert ran == ["two", "one", "one", "two"]


def test_an_unknown_name_exits_2_naming_it_and_runs_nothing(monkeypatch, capsys):
    ran = fake_benchmarks(monkeypatch)
    assert dispatch.main(["one", "nosuch", "--size", "5"]) == 2
    assert "unknown benchmark(s): nosuch" in capsys.readouterr().err
    assert ran == []


def test_every_benchmark_named_imports_and_has_a_main() -> None:
    import importlib

    for name, module in dispatch.BENCHMARKS.items():
        assert callable(importlib.import_module(module).main), name
