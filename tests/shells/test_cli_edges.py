"""The `snapmesh` entry point at its edges: an optional extra that is missing,
and a reader that goes away (`| head`). Real subprocesses: the interpreter's own
exit path (its final flush of stdout) is part of what is checked."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A command that prints far more than a pipe holds, registered for this run only.
_LOUD = textwrap.dedent(
    """
    import sys, types
    import snapmesh.cli as cli
    loud = types.ModuleType("loud")
    def main(argv):
        for i in range(200_000):
            print(f"line {i} " + "x" * 60)
        return 0
    loud.main = main
    sys.modules["loud"] = loud
    cli.COMMANDS["loud"] = ("loud", "prints a lot")
    sys.exit(cli.main(["loud"]))
    """
)

# pyspark hidden: an import of it fails as it does where the extra is not installed.
_NO_SPARK = textwrap.dedent(
    """
    import sys
    sys.modules["pyspark"] = None
    import snapmesh.cli as cli
    sys.exit(cli.main(["reconcile", "--help"]))
    """
)


def test_a_reader_that_goes_away_ends_the_command_quietly():
    proc = subprocess.Popen([sys.executable, "-c", _LOUD], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"line 0 ")
    proc.stdout.close()  # as `| head -1` does
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err, err.decode()
    assert b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == 1


def test_a_missing_extra_names_the_extra_to_install():
    done = subprocess.run([sys.executable, "-c", _NO_SPARK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["snapmesh reconcile: needs pyspark, which is not installed: pip install 'snapmesh[reconcile]'"], lines


def test_a_missing_module_that_is_no_extra_is_still_a_bug():
    code = _NO_SPARK.replace('sys.modules["pyspark"] = None', 'sys.modules["grpc"] = None').replace(
        '["reconcile", "--help"]', '["health", "--help"]'
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "ModuleNotFoundError" in done.stderr
