"""docs/apps.md's "Batches" and docs/architecture.md's one data path, held to the code.

The figures the Batches section quotes are the edge's constants (services/node/edge.py),
its whole-batch refusals are the edge's texts, and no doc says a bank node refuses
Submit, SubmitBatch or Query: the bank is an app and answers them as any app's node.
The architecture's data path names the edge as the line below which only bytes go,
and the bank's v1 adapter above it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from snapmesh.app import Refused
from snapmesh.services.node import edge as node_edge

ROOT = Path(__file__).resolve().parents[2]


def section(doc: str, title: str) -> str:
    text = (ROOT / "docs" / doc).read_text(encoding="utf-8")
    assert f"\n## {title}\n" in text, f"docs/{doc} has no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def words(text: str) -> str:
    return " ".join(text.split())


def test_the_batches_section_quotes_the_edges_limits():
    batches = words(section("apps.md", "4. Batches"))
    assert f"more than {node_edge.MAX_BATCH_COMMANDS:,} items" in batches
    assert f"more than {node_edge.MAX_BATCH_BYTES // 2**20} MiB of commands and request ids" in batches
    assert f"a command over {node_edge.MAX_COMMAND_BYTES // 2**20} MiB as `INVALID_ARGUMENT`" in batches
    assert f"applies {node_edge.COMMANDS_PER_STEP} items per step" in batches
    for said in ("`request_id` (optional) and a `command`", "one per item in the order sent", "`code`",
                 "`message`", "`reply`", "`epoch`", "`INVALID_ARGUMENT` for an empty batch",
                 "`request_id` that appears twice in the batch", "`node.submit_many`"):
        assert said in batches, said


@pytest.mark.parametrize("items, named", [
    ([], "at least one command"),
    ([("r", b"x")] * (node_edge.MAX_BATCH_COMMANDS + 1), f"at most {node_edge.MAX_BATCH_COMMANDS} commands"),
    ([("r", b"x"), ("r", b"y")], "'r' appears twice in one batch (items 0 and 1)"),
])
def test_the_whole_batch_refusals_the_section_names_are_the_edges(items, named):
    # An engine stand-in that would fail any step: the refusal comes before anything runs.
    engine = SimpleNamespace(node_id="p1", refusal=lambda rpc: "")
    with pytest.raises(Refused) as refused:
        asyncio.run(node_edge.Edge(engine).submit_many(items))
    assert refused.value.code == "INVALID_ARGUMENT" and named in refused.value.text


@pytest.mark.parametrize("doc", ["apps.md", "api.md", "architecture.md"])
def test_no_doc_says_a_bank_node_refuses_the_app_calls(doc):
    text = words((ROOT / "docs" / doc).read_text(encoding="utf-8")).replace("`", "")
    for wrong in ("UNIMPLEMENTED on a node that runs the bank", "UNIMPLEMENTED on a bank node",
                  "a bank node says UNIMPLEMENTED"):
        assert wrong not in text, f"docs/{doc}: {wrong!r}"


def test_the_architecture_draws_one_data_path():
    path = section("architecture.md", "One data path: bytes below the edge")
    for said in ("services/node/edge.py", "bytes only below", "snapmesh/bank/edge.py", "App.edge",
                 "services/node/extra_edge.py", "services/app/bank.py", "apphost.py", "App.v1_fields"):
        assert said in path, said
    # The adapter is drawn above the line, the node machine below it.
    assert path.index("snapmesh/bank/edge.py") < path.index("bytes only below") < path.index("machine.py")
