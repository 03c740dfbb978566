"""The one polling helper of the tests: call a probe until its value holds.

Every wait in tests/ goes through `wait_for` (tests/checking/test_lanes.py fails on
another function that loops on the clock with time.sleep).
"""

from __future__ import annotations

import reprlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_NONE_YET = object()


class WaitTimedOut(AssertionError, TimeoutError):
    """A wait that ran out: an AssertionError (a test failure), and a TimeoutError for a caller that catches one."""


def wait_for(probe: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str = "condition",
             until: Callable[[T], Any] = bool, retry_on: type[BaseException] | tuple[type[BaseException], ...] = ()) -> T:
    """`probe()` every `interval` seconds until `until(value)` holds; that value.

    An exception of `retry_on` from the probe counts as "not yet" (others propagate).
    At `timeout` it fails with WaitTimedOut naming `what`, the timeout, the last value
    and the last retried exception."""
    deadline = time.monotonic() + timeout
    value: Any = _NONE_YET
    error: BaseException | None = None
    while True:
        try:
            value = probe()
        except retry_on as exc:
            error = exc
        else:
            if until(value):
                return value
        if time.monotonic() >= deadline:
            last = "no value" if value is _NONE_YET else f"last value {reprlib.repr(value)}"
            detail = f"; last error {error!r}" if error is not None else ""
            raise WaitTimedOut(f"timed out after {timeout:g}s waiting for {what}: {last}{detail}")
        time.sleep(interval)
