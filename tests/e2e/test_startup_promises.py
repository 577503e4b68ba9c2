"""What the README and docs promise about start-up, each against the real server: a symlink out of the
repository is a configuration error; without the gRPC port grpcio is never imported; an https:// model
is downloaded and checked against its sha256 before it serves."""

from __future__ import annotations

import hashlib
import http.server
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support import ROOT, free_port, matmul_model, request, wait_ready

HIDDEN = ROOT / "tests" / "data" / "hidden_packages"  # makes the packages it is told of fail to import


def serve(arguments: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "edgeinfer", "serve", "--metrics-port", "0", *arguments]
    return subprocess.Popen(
        command,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def ended(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=60)
    return process.returncode, output


def test_a_symlink_out_of_the_repository_stops_the_server_with_2(tmp_path: Path):
    """docs/security.md: at start-up a symlink out of the repository is refused, naming both paths."""
    repo = tmp_path / "repo"
    matmul_model(repo / "m" / "1" / "model.onnx")
    matmul_model(tmp_path / "outside" / "1" / "model.onnx")
    (repo / "escape").symlink_to(tmp_path / "outside")
    code, output = ended(serve(["--model-repository", str(repo), "--no-grpc", "--http-port", "0"]))
    assert code == 2, output
    outside = tmp_path / "outside"
    assert (
        f"edgeinfer: configuration error: model directory {repo / 'escape'} resolves to {outside}, "
        f"outside the model repository {repo}"
    ) in output


@pytest.mark.parametrize(
    ("arguments", "config"),
    [(["--no-grpc"], ""), ([], "server: {grpc_port: null}\n")],
    ids=["--no-grpc", "grpc_port: null"],
)
def test_without_the_grpc_port_grpcio_is_never_imported(tmp_path: Path, arguments: list[str], config: str):
    """docs/deployment.md: grpcio and protobuf's gRPC code are imported only when the gRPC port is on. The
    server is started with grpc made to fail on import: it serves all the same, and no port is gRPC's."""
    matmul_model(tmp_path / "repo" / "m" / "1" / "model.onnx")
    (tmp_path / "config.yaml").write_text(f"model_store_path: {tmp_path / 'repo'}\n{config}")
    port = free_port()
    hidden = {"PYTHONPATH": str(HIDDEN), "EDGEINFER_TEST_HIDDEN": "grpc"}
    process = serve(["--config", str(tmp_path / "config.yaml"), "--http-port", str(port), *arguments], hidden)
    try:
        assert wait_ready(port, 30, process), ended(process)
        assert request(port, "GET", "/v2/models/m/ready").status == 200
    finally:
        process.terminate()
        code, output = ended(process)
    assert code == 0, output
    assert "gRPC on (off)" in output, output


@pytest.fixture(scope="module")
def https_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, Path]]:
    """An HTTPS server on loopback serving a folder, with a CA of its own: (port, folder, CA file)."""
    folder = tmp_path_factory.mktemp("web")
    ca = trustme.CA()
    ca_file = folder.parent / "web-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)

    class Files(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def log_message(self, *args):  # the test's output stays the server's
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], folder, ca_file
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("digest_matches", [True, False], ids=["sha256-matches", "sha256-differs"])
def test_an_https_model_is_downloaded_and_checked_at_start_up(
    tmp_path: Path, https_files: tuple[int, Path, Path], digest_matches: bool
):
    """docs/lifecycle.md: an https:// model_path is downloaded when its model loads and checked against
    sha256; one that does not match is refused (the server exits 1 naming both digests)."""
    web_port, folder, ca_file = https_files
    model = matmul_model(folder / f"model-{digest_matches}.onnx")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    configured = digest if digest_matches else "0" * 64
    url = f"https://localhost:{web_port}/{model.name}"
    (tmp_path / "config.yaml").write_text(
        f"repository: {{cache_dir: {tmp_path / 'cache'}}}\n"
        f"models:\n  web: {{model_path: '{url}', sha256: '{configured}'}}\n"
    )
    port = free_port()
    trust = {"SSL_CERT_FILE": str(ca_file)}  # the machine's roots do not know the test's CA
    process = serve(["--config", str(tmp_path / "config.yaml"), "--no-grpc", "--http-port", str(port)], trust)
    if not digest_matches:
        code, output = ended(process)
        assert code == 1, output
        assert f"{url} has sha256 {digest}, not the configured {configured}" in output
        assert not list((tmp_path / "cache").rglob("*.onnx")), "nothing that failed its check is kept"
        return
    try:
        assert wait_ready(port, 30, process), ended(process)
        assert request(port, "GET", "/v2/models/web/ready").status == 200
    finally:
        process.terminate()
        ended(process)
