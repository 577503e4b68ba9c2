"""KServe's own Python clients (REST and gRPC, protocol v2), used as the example shows, against the example
server. They run in a subprocess: KServe's gRPC client registers the same protobuf names as tritonclient's,
which the rest of the suite imports."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.support import EXAMPLES, ServerProcess

pytestmark = pytest.mark.skipif(  # found, not imported: importing it here would break tritonclient
    importlib.util.find_spec("kserve") is None, reason="KServe's client is in the dev extra"
)


def test_kserve_rest_and_grpc_clients(example_server: ServerProcess):
    script = EXAMPLES / "clients" / "kserve_infer.py"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            f"127.0.0.1:{example_server.port}",
            f"127.0.0.1:{example_server.grpc_port}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "rest live: True | ready: True"
    assert lines[1] == "rest OUTPUT0 [2, 16] [0.        0.5539481 0.        0.       ] | id: kserve-1"
    assert lines[2] == "rest binary [2, 16] [0.        0.5539481 0.        0.       ]"
    assert lines[3] == "grpc live: True | ready: True"
    assert lines[4] == "grpc OUTPUT0 [2, 16] [0.        0.5539481 0.        0.       ] | id: kserve-1"
