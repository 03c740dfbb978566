"""`python -m bench cluster|overtake --topology NAME`: every cluster the bench starts is written on it."""

from __future__ import annotations

from collections import Counter

import pytest

from bench import lab, phases
from snapmesh.settings import config as cluster_config


class _Started:
    """A stand-in for the supervisor's Cluster: it remembers the file, starts nothing."""

    def __init__(self, path, **options) -> None:
        self.path = path

    def start(self):
        return self


def test_the_flag_reaches_the_cluster_file(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "Cluster", _Started)
    args = phases.parse("cluster", ["--topology", "random-regular:2", "--topology-seed", "9"])
    assert args.no_write, "a sparse run must not overwrite the mesh's figures in bench/results.json"
    started = lab.start_cluster(tmp_path, 5, topology=args.topology, topology_seed=args.topology_seed)
    channels = cluster_config.load(started.path, env={}).topology.channels
    assert len(channels) == 10
    assert Counter(s for s, _ in channels) == Counter(d for _, d in channels) == dict.fromkeys(
        [f"p{i}" for i in range(1, 6)], 2)
    assert not phases.parse("overtake", []).no_write and phases.parse("overtake", []).topology == "mesh"


@pytest.mark.parametrize("spec", ["star", "random-regular:0"])
def test_a_bad_name_is_refused_before_anything_runs(spec, capsys):
    with pytest.raises(SystemExit) as stopped:
        phases.parse("cluster", ["--topology", spec])
    assert stopped.value.code == 2 and "--topology" in capsys.readouterr().err
