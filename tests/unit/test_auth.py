"""API keys and roles without a server: key files, the constant-time lookup, which role a route needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.config import AuthConfig
from edgeinfer.errors import ConfigError, PermissionDenied, Unauthenticated
from edgeinfer.server.auth import (
    GRPC_ROUTES,
    Guard,
    KeyRing,
    digest,
    new_key,
    parse_keys,
    presented_key,
)

SECRET = "a-secret-of-enough-length"


def test_keys_come_from_the_file_and_the_environment(tmp_path: Path):
    key, hex_digest = new_key()
    (tmp_path / "keys.yaml").write_text(f"keys: [{{name: cam, sha256: {hex_digest}, roles: [infer]}}]")
    ring = KeyRing.load(
        AuthConfig(keys_file=str(tmp_path / "keys.yaml")),
        {"EDGEINFER_API_KEYS": f"- {{name: ops, key: {SECRET}, roles: [admin, metrics]}}"},
    )
    assert ring.identify(key).name == "cam"
    assert ring.identify(SECRET).roles == {"admin", "metrics"}
    assert not KeyRing.load(AuthConfig(), {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{name: x}", "expected a list of API keys"),
        ("- just a string", "expected a mapping"),
        (f"- {{key: {SECRET}, roles: [infer]}}", "needs a 'name'"),
        (f"- {{name: a, key: {SECRET}, sha256: {'0' * 64}, roles: [infer]}}", "exactly one of 'key'"),
        ("- {name: a, key: short, roles: [infer]}", "at least 16 characters"),
        ("- {name: a, sha256: abc, roles: [infer]}", "64 hex digits"),
        (f"- {{name: a, key: {SECRET}, roles: [root]}}", "'roles' must be a non-empty list"),
        (f"- {{name: a, key: {SECRET}, roles: []}}", "'roles' must be a non-empty list"),
        (f"- {{name: a, key: {SECRET}, roles: [infer], color: red}}", "unknown field(s) color"),
        ("[unclosed", "not valid YAML"),
    ],
)
def test_bad_key_entries_name_what_is_wrong(text: str, message: str):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_keys(text, "keys.yaml")


def test_a_name_given_twice_is_an_error():
    twice = f"- {{name: a, key: {SECRET}, roles: [infer]}}\n- {{name: a, key: {SECRET}x, roles: [admin]}}"
    with pytest.raises(ConfigError, match="name\\(s\\) a appear more than once"):
        KeyRing.load(AuthConfig(), {"EDGEINFER_API_KEYS": twice})


def test_every_digest_is_compared_and_a_wrong_key_is_never_echoed():
    ring = KeyRing(parse_keys(f"- {{name: a, key: {SECRET}, roles: [infer]}}", "x"))
    with pytest.raises(Unauthenticated, match="needs an API key"):
        ring.identify(None)
    with pytest.raises(Unauthenticated) as raised:
        ring.identify("guess-guess-guess-guess")
    assert "guess" not in str(raised.value)
    assert ring.keys[0].digest == digest(SECRET)


@pytest.mark.parametrize(
    ("authorization", "api_key", "presented"),
    [
        (f"Bearer {SECRET}", None, SECRET),
        (f"bearer   {SECRET} ", None, SECRET),
        (f"Basic {SECRET}", None, None),
        ("Bearer ", None, None),
        (None, SECRET, SECRET),
        ("Basic xyz", SECRET, SECRET),
        (None, None, None),
    ],
)
def test_the_key_is_read_from_bearer_or_x_api_key(authorization, api_key, presented):
    assert presented_key(authorization, api_key) == presented


def test_every_rollout_method_needs_the_admin_role():
    """A method missing from GRPC_ROUTES would fail every call once keys are configured."""
    from edgeinfer.protocol.grpc_gen import edgeinfer_rollouts_pb2

    rollouts = edgeinfer_rollouts_pb2.DESCRIPTOR.services_by_name["RolloutService"].methods
    assert len(rollouts) == 8
    assert {method.name for method in rollouts} <= GRPC_ROUTES.keys()
    assert all(GRPC_ROUTES[method.name][0] == "admin" for method in rollouts)


def test_the_guard_answers_401_and_403_and_counts_them():
    counted: list[tuple[str, str]] = []
    ring = KeyRing(parse_keys(f"- {{name: cam, key: {SECRET}, roles: [infer]}}", "x"))
    guard = Guard(ring, ["/v2/health/live", "/v2/models/*/ready"], lambda *reason: counted.append(reason))
    guard.check("http", "/v2/health/live/", "infer", None)  # open
    guard.check("http", "/v2/models/m/ready", "infer", None)  # open by pattern
    guard.check("http", "/v2/models/m/infer", "infer", SECRET)
    with pytest.raises(Unauthenticated):
        guard.check("http", "/v2/models/m/infer", "infer", None)
    with pytest.raises(
        PermissionDenied, match="API key 'cam' has role\\(s\\) infer; /metrics needs role 'metrics'"
    ):
        guard.check("grpc", "/metrics", "metrics", SECRET)
    assert counted == [("http", "unauthenticated"), ("grpc", "forbidden")]
    assert not Guard(KeyRing(()), []).enabled


def test_the_cli_makes_a_key_and_its_entry(capsys: pytest.CaptureFixture[str]):
    from edgeinfer.cli import main

    assert main(["api-key"]) == 0
    out = capsys.readouterr().out
    key = out.split("shown once): ")[1].split()[0]
    entry = out.split("\n", 2)[2].strip()
    ring = KeyRing(parse_keys(entry.replace("CHANGE-ME", "client"), "printed entry"))
    assert ring.identify(key).name == "client"
    assert len(key) >= 40


def test_bad_key_or_certificate_files_stop_the_server_before_anything_loads(tmp_path: Path):
    from edgeinfer.app import Server
    from edgeinfer.config import Config
    from edgeinfer.config_file import parse

    (tmp_path / "keys.yaml").write_text("- {name: a, key: short, roles: [infer]}")
    config = parse(Config, {"server": {"auth": {"keys_file": str(tmp_path / "keys.yaml")}}}, "x")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        Server(config)
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    tls = {"cert_file": str(tmp_path / "cert.pem"), "key_file": str(tmp_path / "key.pem")}
    with pytest.raises(ConfigError, match="the certificate, key or CA cannot be used"):
        Server(parse(Config, {"server": {"tls": tls}}, "x"))
    tls["cert_file"] = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match=r"cannot read .*missing\.pem"):
        Server(parse(Config, {"server": {"tls": tls}}, "x"))
