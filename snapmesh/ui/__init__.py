"""`snapmesh ui`: a read-only web page over the controller's gRPC API.

- `model.py`: pure: snapshots in, what the page shows out (counts, percentiles,
  history pages, in-flight tables, where an IN_PROGRESS snapshot is stuck).
- `source.py`: the I/O: the controller's gRPC API, the nodes' epochs, and, with
  `--data-dir`, the node logs, the controller's journal and the trace picture.
- `pages.py`: HTML (server-rendered, one small inline script for the live refresh).
- `server.py`: the command and the HTTP server (the standard library's).
"""
