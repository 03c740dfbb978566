"""The cluster file: a malformed one is refused with the file and the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapmesh.settings import config
from snapmesh.protocol.retry import Failed
from snapmesh.settings.agreement import Agreement, disagreement
from snapmesh.v1 import snapmesh_pb2 as pb

GOOD = """\
data_dir = "data"
initial_balance = 500
channels = [["a", "b"], ["b", "a"]]

[controller]
host = "127.0.0.1"
port = 7000
metrics_port = 7001
snapshot_deadline_s = 2.5

[[nodes]]
id = "a"
host = "127.0.0.1"
port = 7002
metrics_port = 7003

[[nodes]]
id = "b"
host = "127.0.0.1"
port = 7004
metrics_port = 7005
listen_port = 7104
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_good_file_loads_with_paths_relative_to_it(tmp_path):
    cfg = config.load(write(tmp_path, GOOD), env={})
    assert cfg.data_dir == (tmp_path / "data").resolve()
    assert cfg.log_path("a") == cfg.data_dir / "a.log.jsonl"
    assert cfg.snapshots_dir == cfg.data_dir / "snapshots"
    assert cfg.expected_total == 1000
    assert cfg.controller.address == "127.0.0.1:7000" and cfg.controller.snapshot_deadline_s == 2.5
    assert cfg.topology.channels == (("a", "b"), ("b", "a"))
    assert cfg.node("b").address == "127.0.0.1:7004"
    assert cfg.bind_address(cfg.node("b")) == "127.0.0.1:7104"  # listens behind a proxy
    assert cfg.bind_address(cfg.node("a")) == "127.0.0.1:7002"
    assert cfg.metrics_bind(cfg.node("a")) == ("127.0.0.1", 7003)


def test_the_environment_moves_the_data_and_the_bind_address(tmp_path):
    cfg = config.load(write(tmp_path, GOOD), env={"SNAPMESH_DATA_DIR": "/srv/d", "SNAPMESH_BIND_HOST": "0.0.0.0"})
    assert cfg.data_dir == Path("/srv/d")
    assert cfg.bind_address(cfg.node("a")) == "0.0.0.0:7002"
    assert cfg.node("a").address == "127.0.0.1:7002"  # peers still dial the configured host


def test_without_channels_the_topology_is_the_full_mesh(tmp_path):
    cfg = config.load(write(tmp_path, GOOD.replace('channels = [["a", "b"], ["b", "a"]]\n', "")), env={})
    assert set(cfg.topology.channels) == {("a", "b"), ("b", "a")}


def test_channel_bound_and_segment_records_default_and_can_be_set(tmp_path):
    cfg = config.load(write(tmp_path, GOOD), env={})
    assert (cfg.channel_bound, cfg.segment_records) == (100_000, 100_000)
    text = GOOD.replace("initial_balance = 500", "initial_balance = 500\nchannel_bound = 50\nsegment_records = 300")
    cfg = config.load(write(tmp_path, text), env={})
    assert (cfg.channel_bound, cfg.segment_records) == (50, 300)


def test_max_reply_bytes_defaults_to_one_mib_and_can_be_set(tmp_path):
    assert config.load(write(tmp_path, GOOD), env={}).max_reply_bytes == 1024 * 1024
    text = GOOD.replace("initial_balance = 500", "initial_balance = 500\nmax_reply_bytes = 4096")
    assert config.load(write(tmp_path, text), env={}).max_reply_bytes == 4096


def test_snapshot_mode_defaults_to_classic_and_can_be_overtake(tmp_path):
    assert config.load(write(tmp_path, GOOD), env={}).snapshot_mode == "classic"
    text = GOOD.replace("initial_balance = 500", 'initial_balance = 500\nsnapshot_mode = "overtake"')
    assert config.load(write(tmp_path, text), env={}).snapshot_mode == "overtake"


def test_the_shipped_default_is_a_four_node_mesh():
    cfg = config.load(config.DEFAULT_CONFIG, env={})
    assert [n.id for n in cfg.nodes] == ["p1", "p2", "p3", "p4"]
    assert len(cfg.topology.channels) == 12


def test_the_shipped_defaults_data_dir_is_under_the_current_directory(tmp_path, monkeypatch):
    # Installed, the shipped file lies in site-packages: its data must not go there.
    monkeypatch.chdir(tmp_path)
    cfg = config.load(config.DEFAULT_CONFIG, env={})
    assert cfg.data_dir == tmp_path / "data"
    assert not cfg.data_dir.is_relative_to(config.DEFAULT_CONFIG.parent.parent)
    # Any other file's relative data_dir stays relative to the file, wherever it is run.
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert config.load(write(other, GOOD), env={}).data_dir == other / "data"


@pytest.mark.parametrize(
    "old, new, field, problem",
    [
        ("initial_balance = 500", "initial_balance = -1", "initial_balance", "integer >= 0"),
        ("initial_balance = 500", 'initial_balance = "500"', "initial_balance", "integer >= 0"),
        ("initial_balance = 500", "initial_balance = true", "initial_balance", "integer >= 0"),
        ("initial_balance = 500", "initial_balance = 500\nchannel_bound = 0", "channel_bound", "integer >= 1"),
        ("initial_balance = 500", "initial_balance = 500\nsegment_records = 1", "segment_records", "integer >= 2"),
        ("initial_balance = 500", "initial_balance = 500\nmax_reply_bytes = 0", "max_reply_bytes", "integer >= 1"),
        ('data_dir = "data"\n', "", "data_dir", "missing"),
        ("initial_balance = 500", 'initial_balance = 500\nsnapshot_mode = "fast"', "snapshot_mode", "'classic', 'overtake'"),
        ("port = 7000", "port = 70000", "controller.port", "1-65535"),
        ("port = 7000", "port = 0", "controller.port", "integer >= 1"),
        ("snapshot_deadline_s = 2.5", "snapshot_deadline_s = 0", "controller.snapshot_deadline_s", "positive"),
        ('id = "a"', 'id = ""', "nodes[0].id", "non-empty string"),
        ('id = "a"', 'id = "a:b"', "nodes[0].id", "'a:b' is not a node id"),  # msg ids split at ':'
        ('id = "a"', 'id = "../etc"', "nodes[0].id", "'../etc' is not a node id"),
        ('id = "a"', 'id = "x/y"', "nodes[0].id", "'x/y' is not a node id"),
        ('id = "a"', 'id = ".a"', "nodes[0].id", "not starting with '.'"),
        ('id = "a"', 'id = "a b"', "nodes[0].id", "'a b' is not a node id"),
        ('id = "a"', f'id = "{"n" * 65}"', "nodes[0].id", "65 characters, at most 64"),
        ("port = 7004", "port = 7002", "node b port", "already used by node a port"),
        ("metrics_port = 7005", "metrics_port = 7000", "node b metrics_port", "already used by controller port"),
        ('channels = [["a", "b"], ["b", "a"]]', 'channels = [["a", "b"]]', "channels", "not strongly connected"),
        ('channels = [["a", "b"], ["b", "a"]]', 'channels = [["a", "c"], ["b", "a"]]', "channels", "unknown node 'c'"),
        ('channels = [["a", "b"], ["b", "a"]]', 'channels = [["a", "a"]]', "channels", "joins a node to itself"),
        ('channels = [["a", "b"], ["b", "a"]]', 'channels = "mesh"', "channels", "array of [src, dst] pairs"),
        ("initial_balance = 500", "initial_balance = 500\nreplicas = 3", "replicas", "unknown field"),
        ("listen_port = 7104", "listen_prot = 7104", "nodes[1].listen_prot", "unknown field"),
    ],
)
def test_a_malformed_file_names_the_file_and_the_field(tmp_path, old, new, field, problem):
    assert old in GOOD
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(config.ConfigError) as raised:
        config.load(path, env={})
    message = str(raised.value)
    assert message.startswith(f"{path}: {field}: "), message
    assert problem in message, message


def test_no_nodes_missing_file_and_bad_toml_are_named(tmp_path):
    no_nodes = GOOD.split("[[nodes]]")[0]
    with pytest.raises(config.ConfigError, match=r"nodes: must be a non-empty array"):
        config.load(write(tmp_path, no_nodes), env={})
    with pytest.raises(config.ConfigError, match=r"missing\.toml: no such file"):
        config.load(tmp_path / "missing.toml", env={})
    with pytest.raises(config.ConfigError, match=r"cluster\.toml: not valid TOML: .*line 1"):
        config.load(write(tmp_path, "data_dir = \n"), env={})


def test_an_unknown_node_id_lists_the_known_ones(tmp_path):
    cfg = config.load(write(tmp_path, GOOD), env={})
    with pytest.raises(config.ConfigError, match=r"no node 'z' \(nodes: a, b\)"):
        cfg.node("z")


def test_controller_keep_is_a_positive_count_or_absent(tmp_path):
    assert config.load(write(tmp_path, GOOD), env={}).controller.keep == 0  # absent: keep every snapshot file
    kept = GOOD.replace("snapshot_deadline_s = 2.5", "snapshot_deadline_s = 2.5\nkeep = 3")
    assert config.load(write(tmp_path, kept), env={}).controller.keep == 3
    bad = GOOD.replace("snapshot_deadline_s = 2.5", "snapshot_deadline_s = 2.5\nkeep = 0")
    with pytest.raises(config.ConfigError, match="controller.keep"):
        config.load(write(tmp_path, bad), env={})


def test_the_app_defaults_to_the_bank_and_app_takes_a_module_and_params(tmp_path):
    assert config.load(write(tmp_path, GOOD), env={}).app == config.AppSettings()
    assert config.runs_bank(config.load(write(tmp_path, GOOD), env={}).app)
    cfg = config.load(write(tmp_path, GOOD + '\n[app]\nmodule = "token_ring:app"\ntokens = 2\n'), env={})
    assert (cfg.app.module, dict(cfg.app.params)) == ("token_ring:app", {"tokens": 2})
    assert not config.runs_bank(cfg.app)
    moved = config.load(write(tmp_path, GOOD + '\n[app]\nmodule = "a:b"\ntokens = 2\n'), env={"SNAPMESH_APP": "c.d:e"})
    assert (moved.app.module, dict(moved.app.params)) == ("c.d:e", {"tokens": 2})
    assert config.with_app(cfg, "kvshard").app.module == "kvshard"
    assert config.with_app(cfg, None) is cfg


def test_a_file_without_app_hosts_the_bank_app_with_its_initial_balance(tmp_path):
    cfg = config.load(write(tmp_path, GOOD), env={})
    assert (config.hosted(cfg).module, dict(config.hosted(cfg).params)) == ("bank", {"initial_balance": 500})
    named = config.load(write(tmp_path, GOOD + '\n[app]\nmodule = "bank"\ntotal = 9\n'), env={})
    assert dict(config.hosted(named).params) == {"initial_balance": 500, "total": 9}
    own = config.load(write(tmp_path, GOOD + '\n[app]\nmodule = "bank"\ninitial_balance = 7\n'), env={})
    assert dict(config.hosted(own).params) == {"initial_balance": 7}  # the [app] table's own wins
    other = config.load(write(tmp_path, GOOD + '\n[app]\nmodule = "kvshard"\nkeys = 4\n'), env={})
    assert config.hosted(other) == other.app


def test_a_rescale_keeps_the_banks_total_in_its_app_table(tmp_path):
    from snapmesh.processes.rescaler import _kept_total

    cfg = config.load(write(tmp_path, GOOD), env={})
    kept = _kept_total(cfg, {"nodes": [], "app": {"module": "bank"}})
    assert kept["app"] == {"module": "bank", "total": 500 * len(cfg.nodes)}
    named = config.load(write(tmp_path, GOOD + '\n[app]\nmodule = "bank"\ntotal = 9\n'), env={})
    assert _kept_total(named, {"nodes": []}) == {"nodes": []}  # a total named is kept as it is
    other = config.load(write(tmp_path, GOOD + '\n[app]\nmodule = "kvshard"\n'), env={})
    assert _kept_total(other, {"nodes": []}) == {"nodes": []}


def test_initial_balance_is_the_banks_so_an_apps_file_may_leave_it_out(tmp_path):
    without = GOOD.replace("initial_balance = 500\n", "")
    cfg = config.load(write(tmp_path, without + '\n[app]\nmodule = "kvshard"\nkeys = 4\n'), env={})
    assert (cfg.app.module, cfg.initial_balance) == ("kvshard", 0)
    assert config.load(write(tmp_path, without), env={"SNAPMESH_APP": "token_ring:app"}).initial_balance == 0
    for bank in ("", '\n[app]\nmodule = "bank"\n'):  # the bank's file still needs it
        with pytest.raises(config.ConfigError, match="initial_balance: missing"):
            config.load(write(tmp_path, without + bank), env={})


@pytest.mark.parametrize(
    ("table", "env", "message"),
    [
        ('[app]\nmodule = "no colon here"\n', {}, "app.module: must be module:attr"),
        ("[app]\ntokens = 1\n", {}, "app.module: missing"),
        ('app = "x:y"\n', {}, "app: must be a table"),
        ("", {"SNAPMESH_APP": "a:"}, "SNAPMESH_APP: must be module:attr"),
    ],
)
def test_a_bad_app_table_names_the_file_and_the_key(tmp_path, table, env, message):
    text = table + GOOD if table.startswith("app =") else GOOD + "\n" + table
    with pytest.raises(config.ConfigError, match=message) as caught:
        config.load(write(tmp_path, text), env=env)
    assert str(tmp_path / "cluster.toml") in str(caught.value)
    with pytest.raises(config.ConfigError, match="--app: must be module:attr"):
        config.with_app(config.load(write(tmp_path, GOOD), env={}), "a.py")


def test_a_node_that_runs_another_snapshot_mode_or_app_is_a_disagreement_in_words(tmp_path):
    cfg = config.load(write(tmp_path, GOOD), env={})  # classic, the bank
    assert disagreement(cfg, "a", "", "") == ""  # "": classic, the bank
    assert disagreement(cfg, "a", "overtake", "") == (
        f"{cfg.path}: snapshot_mode: the controller runs 'classic' but node 'a' runs 'overtake'; "
        "every process must read the same snapshot_mode"
    )
    assert disagreement(cfg, "b", "classic", "token_ring:app") == (
        f"{cfg.path}: [app]: the controller runs the bank but node 'b' runs token_ring:app; "
        "every process must run the same app"
    )
    ring = config.with_app(cfg, "token_ring:app")
    assert disagreement(ring, "b", "classic", "token_ring:app") == ""
    assert "the controller runs token_ring:app but node 'a' runs the bank" in disagreement(ring, "a", "", "")


def test_the_start_up_check_asks_again_who_did_not_answer_and_stops_at_the_first_disagreement(tmp_path):
    cfg = config.load(write(tmp_path, GOOD), env={})
    agreement = Agreement(cfg, ["b", "a"])
    assert agreement.to_ask() == ["a", "b"] and not agreement.done
    assert agreement.answered("a", Failed("UNAVAILABLE", "down")) == ""  # asked again next round
    assert agreement.answered("b", pb.NodeStateResponse()) == ""  # "": classic, the bank
    assert agreement.to_ask() == ["a"] and not agreement.done
    assert "node 'a' runs 'overtake'" in agreement.answered("a", pb.NodeStateResponse(snapshot_mode="overtake"))
    assert agreement.done


def test_the_controllers_flags_override_the_files_settings_and_none_keeps_them() -> None:
    cfg = config.load(config.DEFAULT_CONFIG)
    same = config.with_controller(cfg, snapshot_deadline_s=None, keep=None, max_concurrent_snapshots=None)
    assert same.controller == cfg.controller
    given = config.with_controller(cfg, snapshot_deadline_s=2.5, keep=3, max_concurrent_snapshots=None)
    assert (given.controller.snapshot_deadline_s, given.controller.keep) == (2.5, 3)
    assert given.controller.max_concurrent_snapshots == cfg.controller.max_concurrent_snapshots
    assert given.controller.port == cfg.controller.port
