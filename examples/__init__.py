"""snapmesh's examples, shipped in the wheel as `snapmesh.examples` (docs/apps.md).

`snapmesh examples` (or `python -m snapmesh.examples`; `--path`: the directory
alone) prints where they are. The token ring runs from anywhere as
`--app snapmesh.examples.token_ring:app`, or from a copy of its file as
`--app token_ring:app` in that file's directory.
"""

from __future__ import annotations

from pathlib import Path

WHERE = Path(__file__).resolve().parent


def listing() -> str:
    """Where the examples are, and what is there: one line each."""
    names = sorted(p.name for p in WHERE.iterdir() if not p.name.startswith(("_", ".")) and p.name != "__pycache__")
    return "\n".join([f"snapmesh's examples are in {WHERE}", *(f"  {name}" for name in names),
                      "run one: snapmesh cluster up --app snapmesh.examples.token_ring:app",
                      "or copy it: cp \"$(snapmesh examples --path)/token_ring.py\" . && "
                      "snapmesh cluster up --app token_ring:app",
                      "the shop, a gRPC service of its own that embeds its nodes: shop/README.md"])
