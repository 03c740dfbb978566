"""docs/api.md's "Clients": its Python client and its grpcurl lines, run as printed against a real cluster.

A four-node token ring (examples/token_ring.py; p1 holds the token first), as the
default cluster is laid out. The Python block runs as its own process, exactly as
printed but for the default cluster's addresses, which become the test cluster's
free ports; each `print` line's comment is what it must print. Then each grpcurl
line, with the pinned binary, learning the messages by reflection only: Submit
passes the token on from p2, Query reads p2 without a log record, SubmitBatch at p3
answers one result per item. Between lines the test waits for the token to land (a
pass is answered once logged; the token then takes a channel hop), which is what
the page's "p2, which now holds the token" assumes of a reader.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from snapmesh.processes.supervisor import Cluster
from snapmesh.settings import config
from snapmesh.settings.config import write_cluster
from support.binaries import grpcurl_binary
from support.ring import APP, EXAMPLES, env_with, held_by

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ENV = env_with(EXAMPLES)


def section() -> str:
    return API.read_text(encoding="utf-8").split("\n## Clients\n", 1)[1].split("\n## ", 1)[0]


def python_client() -> str:
    return section().split("```python\n", 1)[1].split("```", 1)[0]


def grpcurl_lines() -> list[str]:
    block = section().split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.startswith("grpcurl ")]


def test_the_python_client_is_about_ten_lines_of_generated_stubs_only() -> None:
    code = python_client()
    assert len(code.strip().splitlines()) <= 13
    imports = [line for line in code.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["import grpc", "from snapmesh.v1 import snapmesh_pb2 as pb, snapmesh_pb2_grpc as pb_grpc"]
    assert len(grpcurl_lines()) == 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api-clients")
    running = Cluster(write_cluster(tmp / "cluster.toml", nodes=4, data_dir=tmp), app=APP, env=ENV)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def test_the_python_client_and_the_grpcurl_lines_run_as_printed(cluster, tmp_path: Path) -> None:
    default = config.load(config.DEFAULT_CONFIG)
    cfg = config.load(cluster.config_path)
    replace = {n.address: cluster.node_address(n.id) for n in default.nodes}

    code = python_client()
    for old, new in replace.items():
        code = code.replace(f'"{old}"', f'"{new}"')
    (tmp_path / "client.py").write_text(code, encoding="utf-8")
    ran = subprocess.run([sys.executable, "client.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=ENV)
    assert ran.returncode == 0, ran.stderr
    expected = [line.split("  # ", 1)[1] for line in python_client().splitlines() if line.strip().startswith("print(")]
    assert ran.stdout.splitlines() == expected

    held_by(cfg, "p2")
    answers = []
    for line in grpcurl_lines():
        if "SubmitBatch" in line:
            held_by(cfg, "p3")
        argv = shlex.split(line)
        args = [str(grpcurl_binary()), *(replace.get(a, a) for a in argv[1:])]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{line}\n{result.stderr}"
        answers.append(json.loads(result.stdout))
    submitted, read, batch = answers
    assert submitted == {"reply": base64.b64encode(b"passed to p3").decode(), "epoch": "1"}
    assert read == {"reply": base64.b64encode(b"0").decode()}
    assert batch == {"results": [{"reply": base64.b64encode(b"1").decode(), "epoch": "1"},
                                 {"code": 3, "message": "unknown command b'dance'; try b'pass' or b'has'"}]}
    # ... and the page says what each answers, in the same words.
    prose = " ".join(section().split())
    for answer in (submitted, read, *batch["results"]):
        assert json.dumps(answer).replace('"', "") in prose.replace('"', ""), answer
    assert re.search(r"`code` 3 INVALID_ARGUMENT", prose)
