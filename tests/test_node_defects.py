"""Defects 1, 2, 6 (second half) and 8 of issue 8, each on real node processes:

1. a second process on a live node's data dir exits 2 and touches nothing;
2. after a failed write or fsync the log writes nothing more, the node stops,
   and a restart recovers from what is on disk (a full tmpfs under load);
6. a FullState too large for one gRPC message is delivered in chunks;
8. a finished part survives a crash before it was reported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node_harness import Cluster, money_check, run_node_once
from services.node.datalock import DataDirLock, DataDirLocked
from snapmesh.v1 import snapmesh_pb2 as pb

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def assert_money_intact(cluster: Cluster, timeout: float = 60) -> dict[str, list[dict]]:
    """After quiescence: every send received exactly once, nothing received that
    was not sent, the balances the nodes serve are their logs' and sum to the total."""
    logs = cluster.wait_settled(timeout)
    report = money_check(logs)
    assert not report["duplicated"], f"received twice: {report['duplicated'][:5]}"
    assert not report["phantom"], f"received, never sent: {report['phantom'][:5]}"
    assert not report["mismatched"], report["mismatched"][:5]
    assert sum(report["balances"].values()) == cluster.total
    assert cluster.balances() == report["balances"]
    return logs


# ------------------------------------------------ 1. two processes on one log


def test_a_second_process_on_a_live_nodes_data_dir_exits_2_and_touches_nothing(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, ["p1", "p2"])
    try:
        cluster.start()
        cluster.stub("p1").Transfer(pb.TransferRequest(to="p2", amount=5), timeout=5)
        before = cluster.log_path("p1").read_bytes()

        second = run_node_once(cluster.config, "p1")

        assert second.returncode == 2, second.stderr
        assert str(cluster.data_dir) in second.stderr and "p1" in second.stderr, second.stderr
        assert f"pid {cluster.nodes['p1'].proc.pid}" in second.stderr, second.stderr
        assert cluster.log_path("p1").read_bytes() == before
        # The first node still serves, and its log is one it can restart on.
        cluster.stub("p1").Transfer(pb.TransferRequest(to="p2", amount=7), timeout=5)
        assert cluster.nodes["p1"].stop() == 0
        cluster.start("p1")
        cluster.stub("p1").Transfer(pb.TransferRequest(to="p2", amount=9), timeout=5)
        assert_money_intact(cluster)
        assert [r["kind"] for r in cluster.logs()["p1"]].count("restart") == 1
    finally:
        cluster.close()


def test_the_data_dir_lock_is_exclusive_names_its_holder_and_is_released(tmp_path: Path) -> None:
    first = DataDirLock.acquire(tmp_path, "p1")
    with pytest.raises(DataDirLocked, match=rf"{tmp_path}.*'p1'.*pid {os.getpid()}"):
        DataDirLock.acquire(tmp_path, "p1")
    DataDirLock.acquire(tmp_path, "p2").release()  # another node's lock is another file
    first.release()
    DataDirLock.acquire(tmp_path, "p1").release()
