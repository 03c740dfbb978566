"""Which app a node runs and with what params (services/node/embedded.py), asked without naming one.

A node runs the app its cluster file names (cluster_config.hosted) with the params the settings
make for it; an embedder may give another app in its place, which runs with the file's [app]
params and answers GetState with its own name. Which is which is asked of the file's app,
loaded by name, never of a built-in app's name.
"""

from __future__ import annotations

from pathlib import Path

from snapmesh.app import App, load_app
from snapmesh.services.node.embedded import _app_params, _app_spec, runs_files_app
from snapmesh.settings import config as cluster_config
from snapmesh.settings.config import write_cluster


class Idle:
    def __init__(self, info) -> None:
        self.info = info

    def on_command(self, command, ctx):
        return b""

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self) -> bytes:
        return b""

    def restore(self, state: bytes) -> None:
        pass


OTHER = App(name="idle", new=Idle)


def cluster(tmp_path: Path, app_table: str = "") -> cluster_config.ClusterConfig:
    path = write_cluster(tmp_path / "cluster.toml", nodes=2, data_dir=tmp_path / "data")
    if app_table:
        path.write_text(path.read_text() + app_table)
    return cluster_config.load(path)


def test_a_file_without_app_runs_its_default_with_the_files_figures(tmp_path):
    cfg = cluster(tmp_path)
    default = load_app(cluster_config.hosted(cfg).module)
    assert runs_files_app(cfg, default)
    assert _app_params(cfg, default, True) == cluster_config.hosted(cfg).params
    assert "initial_balance" in _app_params(cfg, default, True)
    assert _app_spec(cfg, default, True) == ""  # named by the default's names: GetState as it always was


def test_an_app_in_place_of_the_files_default_gets_the_files_app_params_and_its_name(tmp_path):
    cfg = cluster(tmp_path)
    assert not runs_files_app(cfg, OTHER)
    assert _app_params(cfg, OTHER, False) == {}  # not the default's figures
    assert _app_spec(cfg, OTHER, False) == "idle"


def test_a_file_naming_its_app_runs_it_by_its_spec(tmp_path):
    cfg = cluster(tmp_path, '\n[app]\nmodule = "kvshard"\nshards = 4\n')
    kvshard = load_app("kvshard")
    assert runs_files_app(cfg, kvshard)
    assert _app_params(cfg, kvshard, True) == {"shards": 4}
    assert _app_spec(cfg, kvshard, True) == "kvshard"
    # Another app embedded in its place answers with its own name, not the file's.
    assert not runs_files_app(cfg, OTHER)
    assert _app_spec(cfg, OTHER, False) == "idle"


def test_an_app_the_file_names_but_cannot_load_is_not_the_one_given(tmp_path):
    cfg = cluster(tmp_path, '\n[app]\nmodule = "no_such_module_here:app"\n')
    assert not runs_files_app(cfg, OTHER)
