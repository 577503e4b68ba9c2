"""TLS, mTLS and API keys with roles against the real server, with a CA made here (trustme).

Two servers: ``secured`` serves TLS (client certificates optional) with API keys from a file and from
the environment; ``mutual`` requires client certificates and has no keys. Every role is tried on every
route group over HTTP and gRPC, with tritonclient's ``headers=`` as its users send keys.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from tritonclient.utils import InferenceServerException

from edgeinfer.server.auth import digest
from tests.support import (
    ROOT,
    Reply,
    ServerProcess,
    infer_body,
    matmul_model,
    metric,
    needs_tool,
    request,
    rollout,
    wait_for,
)

INFER_KEY = "infer-key-0123456789abcdef"
ADMIN_KEY = "admin-key-0123456789abcdef"
METRICS_KEY = "metrics-key-0123456789abcdef"  # given in the environment, as plain text
ONE_ROW = infer_body({"X": np.ones((1, 16), np.float32)})


class Pki:
    """A CA, the server's certificate, a client certificate, and a second CA for what must fail."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()
        self.write_server_cert(self.ca)
        self.ca.cert_pem.write_to_path(str(folder / "ca.pem"))
        self.client = self.ca.issue_cert("client@example.com")
        self.stranger = self.other_ca.issue_cert("stranger@example.com")

    def write_server_cert(self, ca: trustme.CA) -> None:
        cert = ca.issue_cert("localhost", "127.0.0.1")
        cert.private_key_pem.write_to_path(str(self.folder / "key.pem"))
        cert.cert_chain_pems[0].write_to_path(str(self.folder / "cert.pem"))

    def copy_to(self, folder: Path) -> Path:
        """The server's certificate, key and the CA, copied for a server whose files a test changes."""
        folder.mkdir()
        for name in ("cert.pem", "key.pem", "ca.pem"):
            (folder / name).write_bytes((self.folder / name).read_bytes())
        return folder

    def client_context(
        self, trust: trustme.CA | None = None, cert: trustme.LeafCert | None = None
    ) -> ssl.SSLContext:
        context = ssl.create_default_context()
        (trust or self.ca).configure_trust(context)
        if cert is not None:
            cert.configure_cert(context)
        return context


def repository(root: Path) -> Path:
    matmul_model(root / "repo" / "simple" / "1" / "model.onnx")
    return root / "repo"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("secured")
    (root / "keys.yaml").write_text(
        "keys:\n"
        f"  - {{name: camera, sha256: {digest(INFER_KEY).hex()}, roles: [infer]}}\n"
        f"  - {{name: ops, key: {ADMIN_KEY}, roles: [admin]}}\n"
    )
    (root / "config.yaml").write_text(
        f"model_store_path: {repository(root)}\n"
        "python_path: [" + str(ROOT) + "]\n"
        "models:\n"
        "  sleepy: {backend: python, model_class: 'tests.python_models.models:Sleeper'}\n"
        "server:\n"
        "  host: 127.0.0.1\n"
        f"  tls: {{cert_file: {pki.folder}/cert.pem, key_file: {pki.folder}/key.pem,\n"
        f"         ca_file: {pki.folder}/ca.pem, client_auth: optional, reload_interval_s: 0}}\n"
        f"  auth: {{keys_file: {root}/keys.yaml, allow_code_overrides: true}}\n"
    )
    env = {"EDGEINFER_API_KEYS": f"[{{name: prometheus, key: {METRICS_KEY}, roles: [metrics]}}]"}
    server = ServerProcess(["--config", str(root / "config.yaml")], env=env, tls=pki.client_context())
    server.start(root / "log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mutual(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("mutual")
    folder = pki.copy_to(root / "pki")
    (root / "config.yaml").write_text(
        f"model_store_path: {repository(root)}\n"
        "server:\n"
        "  host: 127.0.0.1\n"
        f"  tls: {{cert_file: {folder}/cert.pem, key_file: {folder}/key.pem, ca_file: {folder}/ca.pem,\n"
        "         client_auth: require, reload_interval_s: 0.2}\n"
    )
    server = ServerProcess(["--config", str(root / "config.yaml")], tls=pki.client_context(cert=pki.client))
    server.start(root / "log")
    yield server
    server.stop()


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


# (method, path, body, role); None: open to all (a health probe)
HTTP_ROUTES = [
    ("GET", "/v2/health/live", None, None),
    ("GET", "/v2/health/ready", None, None),
    ("GET", "/v2", None, "infer"),
    ("GET", "/v2/models/simple", None, "infer"),
    ("GET", "/v2/models/simple/ready", None, "infer"),
    ("GET", "/v2/models/simple/config", None, "infer"),
    ("POST", "/v2/models/simple/infer", ONE_ROW, "infer"),
    ("GET", "/v1/models", None, "infer"),
    ("GET", "/health", None, "infer"),
    ("GET", "/v2/models/simple/stats", None, "admin"),
    ("GET", "/v2/models/stats", None, "admin"),
    ("POST", "/v2/repository/index", {}, "admin"),
    ("POST", "/v2/repository/models/simple/load", {}, "admin"),
    ("GET", "/metrics", None, "metrics"),
]
KEYS = {"infer": INFER_KEY, "admin": ADMIN_KEY, "metrics": METRICS_KEY}


def test_every_role_on_every_http_route_group(secured: ServerProcess, pki: Pki):
    tls = pki.client_context()
    for method, path, body, role in HTTP_ROUTES:
        for holder, key in [(None, None), ("bad", "not-a-key-at-all-0123456789"), *KEYS.items()]:
            reply = request(secured.port, method, path, body, headers=bearer(key), tls=tls)
            if role is None or holder == role:
                expected = 200
            elif holder is None or holder == "bad":
                expected = 401
            else:
                expected = 403
            assert reply.status == expected, (method, path, holder, reply.status, reply.body)
            if expected == 401:
                assert reply.headers["www-authenticate"] == 'Bearer realm="edgeinfer"'
                assert "API key" in reply.error
            if expected == 403:
                assert reply.error == (
                    f"API key {_name(holder)!r} has role(s) {holder}; {path} needs role {role!r}"
                )
    # X-API-Key is the other way to send a key; a scheme other than Bearer does not count
    infer = ("POST", "/v2/models/simple/infer")
    assert request(secured.port, *infer, ONE_ROW, {"X-API-Key": INFER_KEY}, tls=tls).status == 200
    assert (
        request(secured.port, *infer, ONE_ROW, {"Authorization": f"Basic {INFER_KEY}"}, tls=tls).status == 401
    )
    # the metrics port asks for the metrics role too
    assert request(secured.metrics_port, "GET", "/metrics", tls=tls).status == 401
    assert request(secured.metrics_port, "GET", "/metrics", None, bearer(METRICS_KEY), tls=tls).status == 200


def test_the_status_data_takes_a_metrics_or_an_admin_key(secured: ServerProcess, pki: Pki):
    tls = pki.client_context()
    path = "/v2/ui/state"
    for key in (METRICS_KEY, ADMIN_KEY):
        assert request(secured.port, "GET", path, headers=bearer(key), tls=tls).status == 200
    refused = request(secured.port, "GET", path, headers=bearer(INFER_KEY), tls=tls)
    assert refused.status == 403
    assert refused.error == f"API key 'camera' has role(s) infer; {path} needs role 'metrics' or 'admin'"
    assert request(secured.port, "GET", path, tls=tls).status == 401


def _name(holder: str) -> str:
    return {"infer": "camera", "admin": "ops", "metrics": "prometheus"}[holder]


def grpc_client(
    server: ServerProcess, pki: Pki, cert: trustme.LeafCert | None = None
) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        f"localhost:{server.grpc_port}",
        ssl=True,
        root_certificates=str(pki.folder / "ca.pem"),
        private_key=_pem_file(pki, cert, "key") if cert else None,
        certificate_chain=_pem_file(pki, cert, "chain") if cert else None,
    )


def _pem_file(pki: Pki, cert: trustme.LeafCert, part: str) -> str:
    path = pki.folder / f"{id(cert)}-{part}.pem"
    blob = cert.private_key_pem if part == "key" else cert.cert_chain_pems[0]
    blob.write_to_path(str(path))
    return str(path)


def test_every_role_on_every_grpc_route_group(secured: ServerProcess, pki: Pki):
    client = grpc_client(secured, pki)
    inputs = [grpcclient.InferInput("X", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 16), np.float32))
    calls = [
        (None, lambda headers: client.is_server_live(headers=headers)),
        (None, lambda headers: client.is_server_ready(headers=headers)),
        ("infer", lambda headers: client.get_server_metadata(headers=headers)),
        ("infer", lambda headers: client.get_model_metadata("simple", headers=headers)),
        ("infer", lambda headers: client.get_model_config("simple", headers=headers)),
        ("infer", lambda headers: client.is_model_ready("simple", headers=headers)),
        ("infer", lambda headers: client.infer("simple", inputs, headers=headers)),
        ("admin", lambda headers: client.get_inference_statistics("simple", headers=headers)),
        ("admin", lambda headers: client.get_model_repository_index(headers=headers)),
        ("admin", lambda headers: client.load_model("simple", headers=headers)),
    ]
    try:
        for role, call in calls:
            for holder, key in [(None, None), ("bad", "not-a-key-at-all-0123456789"), *KEYS.items()]:
                headers = {"authorization": f"Bearer {key}"} if key else None
                if role is None or holder == role:
                    call(headers)
                    continue
                with pytest.raises(InferenceServerException) as raised:
                    call(headers)
                expected = "UNAUTHENTICATED" if holder in (None, "bad") else "PERMISSION_DENIED"
                assert raised.value.status() == f"StatusCode.{expected}", (role, holder, raised.value)
        # a streaming call checks the key when it opens
        stream = grpcclient.InferenceServerClient(
            f"localhost:{secured.grpc_port}", ssl=True, root_certificates=str(pki.folder / "ca.pem")
        )
        answers: list[object] = []
        stream.start_stream(callback=lambda result, error: answers.append(error or result))
        # the refusal may end the stream before the message goes out: then the client says so itself
        with contextlib.suppress(InferenceServerException):
            stream.async_stream_infer("simple", inputs)
        stream.stop_stream()
        assert len(answers) == 1
        assert "UNAUTHENTICATED" in str(answers[0])
        stream.start_stream(
            callback=lambda result, error: answers.append(error or result), headers={"x-api-key": INFER_KEY}
        )
        stream.async_stream_infer("simple", inputs)
        stream.stop_stream()
        assert answers[1].as_numpy("Y").shape == (1, 16)
        stream.close()
    finally:
        client.close()


def test_rollout_control_over_grpc_needs_the_admin_role(secured: ServerProcess, pki: Pki):
    ca = (pki.folder / "ca.pem").read_bytes()
    for holder, key in [(None, None), ("bad", "not-a-key-at-all-0123456789"), *KEYS.items()]:
        metadata = [("authorization", f"Bearer {key}")] if key else None
        if holder == "admin":
            assert rollout(secured.grpc_port, "ListRoutes", metadata, ca) == {"routes": {}}
            continue
        with pytest.raises(grpc.RpcError) as refused:
            rollout(secured.grpc_port, "ListRoutes", metadata, ca)
        expected = "UNAUTHENTICATED" if holder in (None, "bad") else "PERMISSION_DENIED"
        assert refused.value.code() == getattr(grpc.StatusCode, expected), (holder, refused.value)


def test_tritonclient_http_sends_keys_with_headers_over_tls(secured: ServerProcess, pki: Pki):
    client = httpclient.InferenceServerClient(
        f"localhost:{secured.port}", ssl=True, ssl_context_factory=lambda: pki.client_context()
    )
    try:
        inputs = [httpclient.InferInput("X", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(np.ones((1, 16), np.float32), binary_data=True)
        result = client.infer("simple", inputs, headers=bearer(INFER_KEY))
        assert result.as_numpy("Y").shape == (1, 16)
        with pytest.raises(InferenceServerException, match="API key"):
            client.infer("simple", inputs)
        with pytest.raises(InferenceServerException, match="needs role 'admin'"):
            client.get_model_repository_index(headers=bearer(INFER_KEY))
        assert client.get_model_repository_index(headers=bearer(ADMIN_KEY))
    finally:
        client.close()


def test_keys_are_never_logged_or_echoed_and_refusals_are_counted(secured: ServerProcess, pki: Pki):
    tls = pki.client_context()
    wrong = "wrong-key-that-must-not-appear-anywhere"
    reply = request(secured.port, "POST", "/v2/models/simple/infer", ONE_ROW, bearer(wrong), tls=tls)
    assert reply.status == 401
    assert wrong not in reply.body.decode()
    refused = {**bearer(INFER_KEY), "x-request-id": "refused-with-a-key"}
    request(secured.port, "POST", "/v2/models/simple/infer", {"inputs": "nonsense"}, refused, tls=tls)
    last = {**bearer(INFER_KEY), "x-request-id": "after-the-others"}
    assert request(secured.port, "POST", "/v2/models/simple/infer", ONE_ROW, last, tls=tls).status == 200
    # access lines are written after their answers, in order: once the last one is there, all are
    wait_for(lambda: "after-the-others" in secured.log(), what="the last request's access line")
    log = secured.log()
    assert "refused-with-a-key" in log, "the refused request's access line (with its message) was read"
    for secret in (INFER_KEY, ADMIN_KEY, METRICS_KEY, wrong):
        assert secret not in log
    samples = scrape_tls(secured, tls)
    assert metric(samples, "edgeinfer_auth_refusals_total", protocol="http", reason="unauthenticated") >= 1
    assert metric(samples, "edgeinfer_auth_refusals_total", protocol="http", reason="forbidden") >= 1
    assert metric(samples, "edgeinfer_auth_refusals_total", protocol="grpc", reason="unauthenticated") >= 1
    assert "auth is OFF" not in log, "keys are configured: no warning"


@needs_tool("curl")
def test_an_upload_without_a_key_is_refused_before_its_body_and_counted_once(
    secured: ServerProcess, pki: Pki, tmp_path: Path
):
    """curl sends ``Expect: 100-continue`` with a body over 1 MB: without a key it gets the 401 instead of
    the go-ahead and uploads nothing."""
    tls = pki.client_context()

    def unauthenticated() -> float:
        counted = scrape_tls(secured, tls).get("edgeinfer_auth_refusals_total", {})
        return counted.get((("protocol", "http"), ("reason", "unauthenticated")), 0.0)

    before = unauthenticated()
    (tmp_path / "body.json").write_bytes(b"{" + b" " * (2 << 20) + b"}")
    curl = subprocess.run(
        ["curl", "-s", "-o", str(tmp_path / "answer.json"), "-w", "%{http_code} %{size_upload}", "--cacert",
         str(pki.folder / "ca.pem"), "--data-binary", f"@{tmp_path / 'body.json'}",
         f"https://127.0.0.1:{secured.port}/v2/models/simple/infer"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert curl.stdout == "401 0", curl
    assert "this route needs an API key" in (tmp_path / "answer.json").read_text()
    assert unauthenticated() == before + 1


def scrape_tls(server: ServerProcess, tls: ssl.SSLContext) -> dict[str, dict[tuple, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    reply = request(server.port, "GET", "/metrics", None, bearer(METRICS_KEY), tls=tls)
    assert reply.status == 200
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_code_overrides_are_allowed_only_when_configured(secured: ServerProcess, pki: Pki):
    tls = pki.client_context()
    override = {
        "parameters": {"config": '{"model_class": "tests.python_models.models:Sleeper", "max_batch_size": 2}'}
    }
    reply = request(
        secured.port, "POST", "/v2/repository/models/sleepy/load", override, bearer(ADMIN_KEY), tls=tls
    )
    assert reply.status == 200, reply.body
    reply = request(
        secured.port, "POST", "/v2/repository/models/sleepy/load", override, bearer(INFER_KEY), tls=tls
    )
    assert reply.status == 403


def test_plain_http_and_old_tls_are_refused(secured: ServerProcess, pki: Pki):
    with socket.create_connection(("127.0.0.1", secured.port), timeout=5) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = sock.recv(1024)
    assert not answer.startswith(b"HTTP/1.1 200"), "nothing is served in clear text on a TLS port"
    old = pki.client_context()
    with warnings.catch_warnings():  # a client that offers TLS 1.1 at most: deprecated, as it should be
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("ALL:@SECLEVEL=0")  # the client would take anything: the server is what refuses
    old.set_alpn_protocols(["h2", "http/1.1"])
    tls12 = pki.client_context()
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    tls12.set_alpn_protocols(["h2", "http/1.1"])
    for port in (secured.port, secured.grpc_port, secured.metrics_port):
        with pytest.raises(ssl.SSLError) as refused:
            handshake(port, old)
        # the server ended the handshake after the client's hello (a refusal of the client's own, such
        # as NO_PROTOCOLS_AVAILABLE, is not one of these); it sends no alert first (see SERVER_REFUSALS)
        assert refused.value.reason in SERVER_REFUSALS, refused.value
        assert handshake(port, tls12) == "TLSv1.2"
    assert request(secured.port, "GET", "/v2/health/live", tls=tls12).status == 200


# How a client sees the server refuse its handshake: the alert where the server sends one, or the
# connection closed. uvloop closes the transport of a failed handshake before OpenSSL's alert is written
# (and grpcio's handshaker does not send one either), so today the client reads an EOF.
SERVER_REFUSALS = {
    "UNEXPECTED_EOF_WHILE_READING",
    "TLSV1_ALERT_PROTOCOL_VERSION",
    "TLSV1_ALERT_UNKNOWN_CA",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
}


def served(port: int, context: ssl.SSLContext) -> str:
    """What a client with ``context`` gets for a request: ``"answered"``; the reason its handshake
    failed with; or ``"closed"``: with TLS 1.3 the client's side of the handshake ends before the server
    has checked the client's certificate, and a server that refuses it then closes without an answer."""
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            return "answered" if sock.recv(4096) else "closed"
    except ssl.SSLError as error:
        return str(error.reason)
    except (ConnectionResetError, BrokenPipeError):  # closed while the request was still unread
        return "closed"


def handshake(port: int, context: ssl.SSLContext) -> str | None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        return sock.version()


def test_sighup_reloads_the_certificate_without_dropping_connections(secured: ServerProcess, pki: Pki):
    tls = pki.client_context()
    import http.client

    kept = http.client.HTTPSConnection("127.0.0.1", secured.port, timeout=10, context=tls)
    kept.request("GET", "/v2/health/live")
    assert kept.getresponse().read() == b'{"live":true}'
    new_ca = trustme.CA()
    pki.write_server_cert(new_ca)
    try:
        assert secured.process is not None
        secured.process.send_signal(signal.SIGHUP)
        wait_until_served(secured.port, pki.client_context(trust=new_ca))
        with pytest.raises(ssl.SSLError):  # new connections no longer get the old certificate
            request(secured.port, "GET", "/v2/health/live", tls=tls)
        kept.request("GET", "/v2/health/live")  # the connection opened before goes on
        assert kept.getresponse().read() == b'{"live":true}'
    finally:
        kept.close()
        pki.write_server_cert(pki.ca)
        assert secured.process is not None
        secured.process.send_signal(signal.SIGHUP)
        wait_until_served(secured.port, tls)
    assert "TLS certificate reloaded" in secured.log()


def wait_until_served(port: int, tls: ssl.SSLContext) -> Reply:
    """The first answer over ``tls`` (the server may still present the certificate it had)."""
    deadline = time.monotonic() + 10
    while (reply := _try_request(port, tls)) is None:
        assert time.monotonic() < deadline, "the new certificate was not served"
        time.sleep(0.05)
    return reply


def _try_request(port: int, tls: ssl.SSLContext) -> Reply | None:
    try:
        return request(port, "GET", "/v2/health/live", tls=tls)
    except ssl.SSLError:
        return None


def test_optional_client_auth_serves_clients_without_a_certificate_or_with_the_cas(
    secured: ServerProcess, pki: Pki
):
    """docs/security.md, ``client_auth: optional``: a client may show no certificate (its API key decides)
    or one the configured CA issued; a certificate of another CA is refused in the handshake."""
    for cert in (None, pki.client):
        tls = pki.client_context(cert=cert)
        reply = request(secured.port, "POST", "/v2/models/simple/infer", ONE_ROW, bearer(INFER_KEY), tls=tls)
        assert reply.status == 200, (cert, reply.body)
    stranger = pki.client_context(cert=pki.stranger)
    assert served(secured.port, stranger) in {"closed", *SERVER_REFUSALS}  # TLS 1.3: once it checked it
    stranger.maximum_version = ssl.TLSVersion.TLSv1_2  # where the handshake itself shows the refusal
    assert served(secured.port, stranger) in SERVER_REFUSALS


def test_mutual_tls_accepts_the_ca_clients_and_refuses_the_rest(mutual: ServerProcess, pki: Pki):
    ok = request(
        mutual.port, "POST", "/v2/models/simple/infer", ONE_ROW, tls=pki.client_context(cert=pki.client)
    )
    assert ok.status == 200
    for cert in (None, pki.stranger):
        refused = pki.client_context(cert=cert)
        assert served(mutual.port, refused) in {"closed", *SERVER_REFUSALS}, cert
        refused.maximum_version = ssl.TLSVersion.TLSv1_2
        assert served(mutual.port, refused) in SERVER_REFUSALS, cert
    assert served(mutual.port, pki.client_context(cert=pki.client)) == "answered"
    client = grpc_client(mutual, pki, pki.client)
    try:
        assert client.is_server_live()
    finally:
        client.close()
    for cert in (None, pki.stranger):
        stranger = grpc_client(mutual, pki, cert)
        try:
            with pytest.raises(InferenceServerException) as raised:
                stranger.is_server_live(client_timeout=5)
            assert raised.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
        finally:
            stranger.close()


def test_a_changed_certificate_file_is_picked_up_by_both_transports(
    mutual: ServerProcess, pki: Pki, tmp_path: Path
):
    folder = Path(mutual.args[1]).parent / "pki"
    new_ca = trustme.CA()
    cert = new_ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    trust_new = pki.client_context(trust=new_ca, cert=pki.client)
    assert wait_until_served(mutual.port, trust_new).status == 200
    (tmp_path / "new-ca.pem").write_bytes(new_ca.cert_pem.bytes())
    channel = grpc.secure_channel(
        f"localhost:{mutual.grpc_port}",
        grpc.ssl_channel_credentials(
            new_ca.cert_pem.bytes(), pki.client.private_key_pem.bytes(), pki.client.cert_chain_pems[0].bytes()
        ),
    )
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
    finally:
        channel.close()
    assert "TLS certificate reloaded" in mutual.log()
    assert os.path.exists(folder / "ca.pem")


@pytest.mark.workers
def test_workers_serve_tls_and_keys_and_reload_on_sighup(pki: Pki, tmp_path: Path):
    """With workers the supervisor and every worker serve TLS and check keys; SIGHUP to the supervisor
    reaches every worker."""
    folder = pki.copy_to(tmp_path / "pki")
    (tmp_path / "config.yaml").write_text(
        f"model_store_path: {repository(tmp_path)}\n"
        "server:\n"
        "  host: 127.0.0.1\n"
        "  workers: 2\n"
        f"  tls: {{cert_file: {folder}/cert.pem, key_file: {folder}/key.pem, reload_interval_s: 0}}\n"
    )
    env = {"EDGEINFER_API_KEYS": f"[{{name: c, key: {INFER_KEY}, roles: [infer]}}, "
                                 f"{{name: p, key: {METRICS_KEY}, roles: [metrics]}}]"}  # fmt: skip
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")], env=env, tls=pki.client_context())
    server.start(tmp_path / "log", timeout=60)
    try:
        tls = pki.client_context()
        for _ in range(10):  # new connections: the kernel spreads them over both workers
            assert request(server.port, "POST", "/v2/models/simple/infer", ONE_ROW, tls=tls).status == 401
            reply = request(
                server.port, "POST", "/v2/models/simple/infer", ONE_ROW, bearer(INFER_KEY), tls=tls
            )
            assert reply.status == 200
        metrics = request(server.metrics_port, "GET", "/metrics", None, bearer(METRICS_KEY), tls=tls)
        assert metrics.status == 200
        assert (
            'edgeinfer_auth_refusals_total{protocol="http",reason="unauthenticated"} 10.0'
            in metrics.body.decode()
        )
        client = grpc_client(server, pki)
        try:
            assert client.is_model_ready("simple", headers={"authorization": f"Bearer {INFER_KEY}"})
        finally:
            client.close()
        new_ca = trustme.CA()
        cert = new_ca.issue_cert("localhost", "127.0.0.1")
        cert.private_key_pem.write_to_path(str(folder / "key.pem"))
        cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
        assert server.process is not None
        reloads = server.log().count("TLS certificate reloaded")
        server.process.send_signal(signal.SIGHUP)
        trust_new = pki.client_context(trust=new_ca)
        wait_for(  # the supervisor and each of its two workers say so once they have read the new files
            lambda: server.log().count("TLS certificate reloaded") == reloads + 3, what="every reload"
        )
        for _ in range(10):
            assert request(server.port, "GET", "/v2/health/live", tls=trust_new).status == 200
        assert wait_until_served(server.metrics_port, trust_new).status == 404  # the supervisor's port too
    finally:
        assert server.stop() == 0
