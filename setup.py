"""The build step pyproject.toml cannot say: generate snapmesh/v1 (protobuf and gRPC
code) from protos/ with grpcio-tools (a build requirement), so a wheel built from a
clean checkout (`pip install git+...` too) has it. All metadata is in pyproject.toml."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.errors import SetupError

ROOT = Path(__file__).resolve().parent


def _protogen():
    # By path: the package itself is not importable while it is being built.
    spec = importlib.util.spec_from_file_location("_snapmesh_protogen", ROOT / "snapmesh" / "commands" / "protogen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProtos(build_py):
    """build_py, then the generated code: into the build directory for a wheel,
    into the source tree for an editable install (which imports from there)."""

    def run(self) -> None:
        super().run()
        out_dir = ROOT if self.editable_mode else Path(self.build_lib)
        if _protogen().generate(out_dir) != 0:
            raise SetupError(f"generating the protobuf code from {ROOT / 'protos'} failed")


setup(cmdclass={"build_py": BuildPyWithProtos})
