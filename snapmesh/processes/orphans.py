"""No orphans: a supervised child asks the kernel to SIGKILL it when its
supervisor dies (Linux PR_SET_PDEATHSIG).

The child does it itself, first thing in `snapmesh.cli.main`, when the
supervisor named its pid in SNAPMESH_DIE_WITH_PARENT. Doing it in a
`preexec_fn` instead would run Python between fork and exec, which is unsafe
in a supervisor with threads (a test's load generator, gRPC's own): children
forked that way crashed.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import MutableMapping

ENV = "SNAPMESH_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def die_with_parent_if_asked(environ: MutableMapping[str, str] = os.environ) -> None:
    """Arm PR_SET_PDEATHSIG when SNAPMESH_DIE_WITH_PARENT names our parent; exit
    at once if that parent is already gone (it died before we could arm it)."""
    parent = environ.pop(ENV, None)
    if not parent:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the supervisor still stops its children on a clean exit
    if str(os.getppid()) != parent:
        os._exit(1)
