"""Moved to snapmesh/node_logs.py; this name is kept only for test files written before the move."""

from snapmesh.node_logs import *  # noqa: F403
from snapmesh.node_logs import LogReadError, log_events, money_check, read_logs, read_node_log  # noqa: F401
