"""Generate the Python protobuf and gRPC code from protos/ into snapmesh/v1/, and the
examples' own protos (examples/*/*.proto) beside them.

The one command that makes generated code: `python -m snapmesh.commands.protogen` (`make proto`).
The output is not committed; it is reproducible from the .proto files alone. A
package build runs it too (setup.py), into the wheel's build directory.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT  # protos/snapmesh/v1/x.proto -> snapmesh/v1/x_pb2.py
EXAMPLES = ROOT / "snapmesh" / "examples"  # snapmesh/examples/shop/shop.proto -> snapmesh/examples/shop/shop_pb2.py


def generate(out_dir: Path = OUT_DIR) -> int:
    """Generate into `out_dir` (default: the source tree); 0 on success."""
    from grpc_tools import protoc

    well_known = resources.files("grpc_tools") / "_proto"
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    examples = sorted(f"snapmesh/examples/{p.parent.name}/{p.name}" for p in EXAMPLES.glob("*/*.proto"))
    for root, files in ((PROTO_DIR, protos), (ROOT, examples)):
        if not files:  # an image's tree ships no examples (snapmesh/examples dangles): nothing to compile
            continue
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *files,
        ]
        status = protoc.main(args)
        if status != 0:
            print(f"protoc failed with status {status} on {' '.join(files)}", file=sys.stderr)
            return status
    for package_dir in {(Path(out_dir) / p).parent for p in protos}:
        (package_dir / "__init__.py").touch()
    return 0


if __name__ == "__main__":
    sys.exit(generate())
