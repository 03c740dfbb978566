"""docs/cluster-file.md names every key the reader (snapmesh/settings/config.py)
knows, no key it does not, and each default as the reader has it. The known keys
come from the reader itself: the list its "unknown field" error gives."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import pytest

from snapmesh.settings import config

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster-file.md"
SECTIONS = ("controller", "nodes", "tls", "auth")  # tables of the file, each a section of the page

MINIMAL = {
    "data_dir": "data",
    "initial_balance": 5,
    "controller": {"host": "127.0.0.1", "port": 20000, "metrics_port": 20001},
    "nodes": [{"id": "p1", "host": "127.0.0.1", "port": 20002, "metrics_port": 20003},
              {"id": "p2", "host": "127.0.0.1", "port": 20004, "metrics_port": 20005}],
    "tls": {"ca": "ca.pem", "cert": "{name}.pem", "key": "{name}-key.pem", "client_cert": "c.pem", "client_key": "k.pem"},
    "auth": {"token_file": "token"},
}


def known_keys(section: str) -> set[str]:
    """The keys the reader accepts in `section` ("" for the top level), from its refusal of one it does not."""
    raw = copy.deepcopy(MINIMAL)
    table = raw if not section else raw[section][0] if section == "nodes" else raw[section]
    table["no_such_key"] = 1
    with pytest.raises(config.ConfigError) as refused:
        config.parse(raw, path=Path("/x/cluster.toml"), env={})
    listed = re.search(r"unknown field \(known: ([^)]*)\)", str(refused.value))
    assert listed, refused.value
    return set(listed[1].split(", "))


def documented() -> dict[str, str]:
    """key (dotted: controller.port) -> its Default cell."""
    rows = re.findall(r"^\| `([a-z_.]+)` \| ([^|]+) \|", DOC.read_text(encoding="utf-8"), re.MULTILINE)
    return {key: default.strip() for key, default in rows if not key.isupper()}


def test_every_key_the_reader_knows_is_documented_and_no_other():
    # [app] is the app's own table: `module`, and any other key is the app's parameter.
    keys = known_keys("") - set(SECTIONS) - {"app"} | {"app.module"}
    for section in SECTIONS:
        keys |= {f"{section}.{key}" for key in known_keys(section)}
    assert set(documented()) == keys
    text = DOC.read_text(encoding="utf-8")
    assert all(f"`[{s}]`" in text or f"`[[{s}]]`" in text for s in (*SECTIONS, "app"))


def test_every_default_written_as_a_value_is_the_readers():
    cfg = config.parse(copy.deepcopy(MINIMAL), path=Path("/x/cluster.toml"), env={})
    checked = 0
    for key, default in documented().items():
        literal = re.fullmatch(r"`([^`]+)`", default)
        if not literal or key == "nodes.listen_port":  # listen_port's default is the node's port
            continue
        section, _, name = key.rpartition(".")
        holder = getattr(cfg, section) if section else cfg
        value = getattr(holder, name)
        value = list(value) if isinstance(value, tuple) else value  # an array is read as a tuple
        assert value == tomllib.loads(f"v = {literal[1]}")["v"], key
        checked += 1
    assert checked >= 7
    assert cfg.node("p1").listen_port is None and cfg.bind_address(cfg.node("p1")).endswith(":20002")
    required = [k for k, d in documented().items() if d.startswith("required")]
    for key in required:  # and a key said to be required is
        raw = copy.deepcopy(MINIMAL)
        section, _, name = key.rpartition(".")
        table = raw if not section else raw[section][0] if section == "nodes" else raw[section]
        del table[name]
        with pytest.raises(config.ConfigError):
            config.parse(raw, path=Path("/x/cluster.toml"), env={})
