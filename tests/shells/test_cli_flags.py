"""Every `snapmesh` command's flags: each has help text, the data dir
is `--data-dir` wherever one is taken (`chaos --dir` stays as its alias), and
an output is named for what it is."""

from __future__ import annotations

import argparse
import importlib

import pytest

from snapmesh.cli import COMMANDS

# The function that builds each command's parser (the modules predate one name for it).
BUILDERS = {"sim": "build_parser", "reconcile": "parser", "synth": "parser", "chaos": "parser"}
# reconcile's own subcommands (prepare, ingest) have their parsers in their modules.
EXTRA = [("snapmesh.reconcile.ingest", "parser")]


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for name, (module, _) in COMMANDS.items():
        build = getattr(importlib.import_module(module), BUILDERS.get(name, "_parser"))
        found.append((name, build()))
    for module, attribute in EXTRA:
        if hasattr(mod := importlib.import_module(module), attribute):
            found.append((module, getattr(mod, attribute)()))
    return found


def walk(name: str, parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for listed in action._choices_actions:  # each subcommand's line in the parent's --help
                yield f"{name} {listed.dest}", listed
            for sub_name, sub in action.choices.items():
                yield from walk(f"{name} {sub_name}", sub)
        elif not isinstance(action, argparse._HelpAction):
            yield name, action


def every_action():
    return [(name, action) for command, parser in parsers() for name, action in walk(command, parser)]


def test_every_flag_and_argument_has_help_text():
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, a in every_action() if not a.help]
    assert missing == []


def test_the_data_dir_is_data_dir_everywhere():
    dirs = [(name, a.option_strings) for name, a in every_action()
            if any(o in ("--dir", "--data-dir", "--data") for o in a.option_strings)]
    assert dirs, "no command takes a data dir?"
    for name, options in dirs:
        assert "--data-dir" in options, (name, options)
    chaos = dict(dirs)["chaos"]
    assert chaos == ["--data-dir", "--dir"]  # the old name kept as an alias


@pytest.mark.parametrize("old, new", [(["--dir"], ["--data-dir"])])
def test_chaos_takes_the_old_dir_flag_as_an_alias(old, new, tmp_path):
    from snapmesh.commands.chaos import parser

    for flag in (*old, *new):
        args = parser().parse_args([flag, str(tmp_path)])
        assert str(args.data_dir) == str(tmp_path)


@pytest.mark.parametrize("module, builder, new, old, dest", [
    ("snapmesh.synth.writer", "parser", "--data-dir", "--out", "out"),  # it writes a data dir
    ("snapmesh.reconcile.job", "parser", "--verdicts-dir", "--out", "out"),
    ("snapmesh.commands.certs", "_parser", "--tls-dir", "--out", "out"),  # what clients then give as --tls-dir
])
def test_outputs_are_named_for_what_they_are_and_the_old_names_still_work(module, builder, new, old, dest, tmp_path):
    build = getattr(importlib.import_module(module), builder)
    required = ["--data-dir", "d"] if module == "snapmesh.reconcile.job" else []
    for flag in (new, old):
        args = build().parse_args([*required, flag, str(tmp_path)])
        assert getattr(args, dest) == str(tmp_path)
    assert new in build().format_help()
