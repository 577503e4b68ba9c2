"""The client examples the README shows run as written against the example server."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from tests.support import EXAMPLES, ServerProcess, needs_tool


@needs_tool("curl")
def test_curl_example(example_server: ServerProcess):
    script = EXAMPLES / "clients" / "curl_infer.sh"
    env = {**os.environ, "URL": f"http://127.0.0.1:{example_server.port}"}
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=30, check=True
    )
    metadata, response = (orjson.loads(line) for line in result.stdout.splitlines() if line.strip())
    assert metadata["name"] == "simple"
    assert response["id"] == "curl-1"
    assert response["outputs"][0]["shape"] == [1, 16]


def test_tritonclient_example(example_server: ServerProcess):
    script = EXAMPLES / "clients" / "tritonclient_infer.py"
    result = subprocess.run(
        [sys.executable, str(script), f"127.0.0.1:{example_server.port}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "ready: True" in result.stdout
    assert "OUTPUT0: (2, 16)" in result.stdout
    assert "LOWER: ['hello' 'edge']" in result.stdout
