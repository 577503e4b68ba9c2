"""Remote repositories: a real local S3-compatible server (moto's server mode) and an HTTP model file."""

from __future__ import annotations

import functools
import hashlib
import http.server
import logging
import threading
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from moto.server import ThreadedMotoServer

from edgeinfer.errors import ModelLoadError
from edgeinfer.repository.remote import S3Mirror, fetch_url
from tests.support import ServerProcess, free_port, infer_body, matmul_model, request

AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})


@pytest.fixture
def s3(monkeypatch):
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="models")
    yield endpoint, client
    server.stop()


def test_an_s3_repository_is_served_and_polled(s3, tmp_path: Path):
    endpoint, client = s3
    matmul_model(tmp_path / "v1.onnx", seed=1)
    matmul_model(tmp_path / "v2.onnx", seed=2)
    client.upload_file(str(tmp_path / "v1.onnx"), "models", "edge/m/1/model.onnx")
    config = tmp_path / "config.yaml"
    cache = tmp_path / "cache"
    config.write_text(
        "model_store_path: s3://models/edge\n"
        f"repository: {{poll_interval_s: 0.3, cache_dir: {cache}, s3_endpoint_url: '{endpoint}'}}\n"
    )
    server = ServerProcess(["--config", str(config)], env=AWS_ENV).start(tmp_path / "log")
    try:
        reply = request(server.port, "POST", "/v2/models/m/infer", ONE_ROW)
        assert (reply.status, reply.json()["model_version"]) == (200, "1")
        client.upload_file(str(tmp_path / "v2.onnx"), "models", "edge/m/2/model.onnx")
        deadline = time.monotonic() + 15
        version = "1"
        while version != "2" and time.monotonic() < deadline:
            version = request(server.port, "POST", "/v2/models/m/infer", ONE_ROW).json()["model_version"]
        assert version == "2", "the new version uploaded was picked up by polling"
    finally:
        server.stop()


@pytest.fixture
def file_server(tmp_path: Path):
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_model_file_from_an_http_url_with_sha256(file_server, tmp_path: Path):
    root, base = file_server
    matmul_model(root / "m.onnx")
    digest = hashlib.sha256((root / "m.onnx").read_bytes()).hexdigest()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"models:\n  web: {{model_path: '{base}/m.onnx', sha256: {digest}}}\n"
        f"repository: {{cache_dir: {tmp_path / 'cache'}}}\n"
    )
    server = ServerProcess(["--config", str(config)]).start(tmp_path / "log")
    try:
        assert request(server.port, "POST", "/v2/models/web/infer", ONE_ROW).status == 200
    finally:
        server.stop()


def test_a_corrupt_download_never_replaces_a_good_copy(file_server, tmp_path: Path):
    root, base = file_server
    matmul_model(root / "m.onnx")
    digest = hashlib.sha256((root / "m.onnx").read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    good = fetch_url(f"{base}/m.onnx", digest, cache)
    original = good.read_bytes()
    (root / "m.onnx").write_bytes(original[:100])  # the server now has a truncated file
    with pytest.raises(ModelLoadError, match="not the configured"):
        fetch_url(f"{base}/m.onnx", "0" * 64, cache)
    assert good.read_bytes() == original
    assert not list(cache.glob("*.partial"))
    assert fetch_url(f"{base}/m.onnx", digest, cache) == good, "a matching cached copy is reused"


class _BreaksOff:
    """A remote file whose connection drops after ``limit`` bytes (what a flaky uplink does)."""

    def __init__(self, inner, limit: int) -> None:
        self.inner, self.left = inner, limit

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        data = self.inner.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(data)
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.inner.close()


def test_an_s3_mirror_drops_deleted_objects_and_never_keeps_a_partial_download(
    s3, tmp_path: Path, monkeypatch, caplog
):
    endpoint, client = s3
    first, second = matmul_model(tmp_path / "a.onnx", seed=1), matmul_model(tmp_path / "b.onnx", seed=2)
    client.upload_file(str(first), "models", "edge/m/1/model.onnx")
    client.upload_file(str(second), "models", "edge/m/2/model.onnx")
    mirror = S3Mirror("s3://models/edge", tmp_path / "cache", endpoint)
    mirror.sync()
    local = mirror.local / "m"
    assert (local / "2" / "model.onnx").read_bytes() == second.read_bytes()

    client.delete_object(Bucket="models", Key="edge/m/2/model.onnx")
    mirror.sync()
    assert not (local / "2").exists(), "an object deleted from the bucket leaves the mirror"

    client.upload_file(str(second), "models", "edge/m/1/model.onnx")  # version 1 changes in the bucket
    real_open = mirror.fs.open
    monkeypatch.setattr(mirror.fs, "open", lambda key, mode="rb": _BreaksOff(real_open(key, mode), 100))
    with caplog.at_level(logging.ERROR, logger="edgeinfer.repository.remote"):
        mirror.sync()
    assert "arrived corrupt or partial (100 of" in caplog.text
    assert (local / "1" / "model.onnx").read_bytes() == first.read_bytes(), "the good copy stays"
    assert not list(mirror.local.rglob("*.partial"))
    monkeypatch.setattr(mirror.fs, "open", real_open)
    mirror.sync()  # the next sync, with a working connection, brings the new file
    assert (local / "1" / "model.onnx").read_bytes() == second.read_bytes()
