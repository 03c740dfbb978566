"""`snapmesh restore --nodes`: a node set with an empty id is one line, exit 2, before any call."""

from __future__ import annotations

import pytest

from snapmesh.commands.restore import main


@pytest.mark.parametrize("nodes", ["p1,,p2", ",", "p1, "])
def test_an_empty_node_id_in_nodes_is_one_line_exit_2(capsys, nodes):
    assert main(["S", "--nodes", nodes, "--controller", "127.0.0.1:1", "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"snapmesh restore: --nodes has an empty node id: {nodes!r}"], err
