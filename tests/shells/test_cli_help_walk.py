"""Every flag of every `snapmesh` command has help text (consistent flags),
found the way a user reaches it: each command's own `main(argv)` is called, and
every argparse parser it builds is caught as it starts to parse, so a parser made
inline in a `main` (not by a builder function) or reached by a word before any
parser (`snapmesh reconcile prepare`, `... ingest`) is walked too, with all of its
subcommands. tests/shells/test_cli_flags.py walks the builder functions it knows."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
from types import SimpleNamespace

import pytest

from snapmesh.cli import COMMANDS

# Flags hidden on purpose (argparse.SUPPRESS): internal plumbing, not for users.
HIDDEN = {("snapmesh reconcile prepare", "--dump")}  # the JVM child's own call (cds.py)


class _Caught(BaseException):  # not an Exception: no `except Exception` in a main swallows it
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _catch(self, args=None, namespace=None):
    raise _Caught(self)


def dispatch_words(module) -> list[str]:
    """Words a main() matches before any parser (`if argv[:1] == ["ingest"]:`)."""
    words = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript)
                and isinstance(node.left.value, ast.Name) and node.left.value.id == "argv"
                and len(node.comparators) == 1 and isinstance(node.comparators[0], ast.List)):
            words += [e.value for e in node.comparators[0].elts if isinstance(e, ast.Constant)]
    return words


def entry_points() -> list[tuple[str, str, list[str]]]:
    found = []
    for name, (module_name, _) in COMMANDS.items():
        module = importlib.import_module(module_name)
        found.append((f"snapmesh {name}", module_name, []))
        found += [(f"snapmesh {name} {w}", module_name, [w]) for w in dispatch_words(module)]
    return found


def caught_parser(module_name: str, argv: list[str]) -> argparse.ArgumentParser:
    module = importlib.import_module(module_name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", _catch)
        try:
            module.main([*argv, "--help"])
        except _Caught as caught:
            return caught.parser
    raise AssertionError(f"{module_name}.main({argv}) parsed no arguments with argparse")


def walk(name: str, parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            seen = set()
            for sub_name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a subcommand already walked
                    continue
                seen.add(id(sub))
                # the subcommand's own line in its parent's --help, then its options
                yield name, SimpleNamespace(option_strings=[], dest=sub_name, help=helps.get(sub_name))
                yield from walk(f"{name} {sub_name}", sub)
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield name, action


def test_the_walk_reaches_the_commands_behind_a_word():
    names = [name for name, _, _ in entry_points()]
    assert "snapmesh reconcile prepare" in names and "snapmesh reconcile ingest" in names


@pytest.mark.parametrize("name, module_name, argv", entry_points(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_option_of_every_parser_has_help_text(name, module_name, argv):
    parser = caught_parser(module_name, argv)
    actions = list(walk(name, parser))
    assert actions or name in ("snapmesh demo",), f"{name}: no options found"
    missing, hidden = [], []
    for where, action in actions:
        flag = "/".join(action.option_strings) or action.dest
        if action.help == argparse.SUPPRESS:
            if (where, action.option_strings[0] if action.option_strings else flag) not in HIDDEN:
                hidden.append(f"{where} {flag}")
        elif not (action.help or "").strip():
            missing.append(f"{where} {flag}")
    assert missing == [], f"options without help text: {missing}"
    assert hidden == [], f"options hidden from --help: {hidden}"


# The value names the commands share, by the type they parse; any other value has its own word.
METAVARS = {int: "N", float: "S"}


@pytest.mark.parametrize("name, module_name, argv", entry_points(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_value_has_its_metavar_and_every_default_is_in_the_help(name, module_name, argv):
    from snapmesh.settings.argparsing import positive_float

    problems = []
    for where, action in walk(name, caught_parser(module_name, argv)):
        if not isinstance(action, argparse.Action) or action.nargs == 0 or not action.option_strings:
            continue
        flag = "/".join(action.option_strings)
        kind = float if action.type is positive_float else action.type
        if action.metavar is None and action.choices is None:
            problems.append(f"{where} {flag}: no metavar (the help shows {action.dest.upper()})")
        elif kind in METAVARS and action.metavar != METAVARS[kind]:
            problems.append(f"{where} {flag}: {kind.__name__} shown as {action.metavar}, not {METAVARS[kind]}")
        if any(o in ("--config",) for o in action.option_strings) and action.metavar != "FILE":
            problems.append(f"{where} {flag}: a file shown as {action.metavar}, not FILE")
        if any(o in ("--controller", "--listen", "--ui") for o in action.option_strings) and action.metavar != "HOST:PORT":
            problems.append(f"{where} {flag}: an address shown as {action.metavar}, not HOST:PORT")
        default = action.default
        if not (default is None or default is False or default == argparse.SUPPRESS) and "default" not in action.help:
            problems.append(f"{where} {flag}: its default {default!r} is not in its help")
        elif not action.required and "default" not in (action.help or ""):  # None too: say what leaving it out means
            problems.append(f"{where} {flag}: its help does not say what leaving it out means (no \"default\")")
        if action.metavar == "S" and (kind is int or action.choices is not None):  # S is seconds everywhere
            problems.append(f"{where} {flag}: S shown for a value that is not seconds")
    assert problems == [], "\n".join(problems)
