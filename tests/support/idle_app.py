"""The source of a one-file app that does nothing, for the tests that write an app
module to disk: `idle_app(init)` is the module up to and with its `workload`; each
test adds the lines that make its case (its `App(...)`, a faulty subclass)."""

from __future__ import annotations

import textwrap


def idle_app(init: str = "pass") -> str:
    """The module's text, with `init` as the body of `Machine.__init__(self, info)`."""
    body = textwrap.indent(textwrap.dedent(init).strip("\n"), " " * 8)
    return f'''
from snapmesh.app import App


class Machine:
    def __init__(self, info):
{body}

    def on_command(self, command, ctx):
        return b""

    def on_message(self, src, payload, ctx):
        pass

    def snapshot(self):
        return b""

    def restore(self, state):
        pass


def workload(nodes, rng):
    while True:
        yield nodes[0].node_id, b"go"

'''
