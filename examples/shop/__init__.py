"""The shop: warehouses on snapmesh, with their own gRPC API (README.md beside this file).

`--app snapmesh.examples.shop:app` runs the warehouses' app (warehouse.py) on a
cluster; `python -m snapmesh.examples.shop.server` is a shop process of the
user's own that embeds its warehouse's node (server.py).
"""

from snapmesh.examples.shop.warehouse import app

__all__ = ["app"]
