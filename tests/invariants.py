"""Moved to snapmesh/logcheck.py (the CLI's `snapmesh chaos` uses it too);
this name is kept only for test files written before the move."""

from snapmesh.logcheck import *  # noqa: F403
from snapmesh.logcheck import InvariantViolation, RecordedSnapshot, StepChecker, check_logs, check_trace  # noqa: F401
