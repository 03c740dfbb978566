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


def test_smoke_comes_before_the_names_and_reaches_every_bench_through_the_environment(monkeypatch):
    """`python -m bench --smoke NAME`: BENCH_SMOKE=1 for the benches and every process they
    start, and the benches that read sys.argv see `python -m bench NAME`."""
    from bench import smoke

    ran = fake_benchmarks(monkeypatch)
    # setenv, not delenv: delenv of an absent name records nothing, and the 1 that
    # --smoke sets would outlive the test (every later merge would write nothing)
    monkeypatch.setenv(smoke.ENV, "")
    monkeypatch.setattr(sys, "argv", ["bench", "--smoke", "two"])
    assert not smoke.on() and smoke.size(1_000, 5) == 1_000
    assert dispatch.main(["--smoke", "two"]) == 0
    assert ran == ["two"] and smoke.on() and smoke.size(1_000, 5) == 5
    assert sys.argv == ["bench", "two"]


def test_a_smoke_run_writes_no_figures(monkeypatch, tmp_path, capsys):
    from bench import results, smoke

    monkeypatch.setenv(smoke.ENV, "1")
    results.merge({"tiny_figure": 1.0}, tmp_path / "results.json")
    assert not (tmp_path / "results.json").exists()
    assert "smoke run: 1 figures not written" in capsys.readouterr().out
    monkeypatch.delenv(smoke.ENV)
    results.merge({"tiny_figure": 1.0}, tmp_path / "results.json")
    assert '"tiny_figure": 1.0' in (tmp_path / "results.json").read_text()


def test_the_reconcile_benchs_floor_job_imports_what_exists() -> None:
    """The floor job is a program in a string, run in a fresh process: a folder move left it
    importing `snapmesh.reconcile.main`, which no longer existed (ImportError at `make bench`)."""
    import ast
    import importlib

    from bench.reconcile import FLOOR_JOB

    for node in ast.walk(ast.parse(FLOOR_JOB)):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(f"{node.module}.{alias.name}"), (
                    f"the floor job imports {alias.name} from {node.module}, which has none")
