"""TLS material: read at start, read again when the files change, kept when a new version is broken."""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

import pytest
import trustme

from edgeinfer.config import TlsConfig
from edgeinfer.server.tls import TlsFiles


def write(folder: Path, ca: trustme.CA) -> None:
    cert = ca.issue_cert("localhost")
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))


def bump(path: Path) -> None:
    """A new modification time even on file systems with coarse timestamps."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_reload_only_on_change_and_never_to_broken_material(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    write(tmp_path, trustme.CA())
    files = TlsFiles(TlsConfig(cert_file=str(tmp_path / "cert.pem"), key_file=str(tmp_path / "key.pem")))
    context = files.http_context()
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert not files.reload()
    assert files.generation == 0
    (tmp_path / "cert.pem").write_text("half-written")
    bump(tmp_path / "cert.pem")
    with caplog.at_level(logging.ERROR):
        assert not files.reload()
    assert "the old certificate stays in use" in caplog.text
    assert files.generation == 0
    write(tmp_path, trustme.CA())
    bump(tmp_path / "cert.pem")
    assert files.reload()
    assert files.generation == 1
    assert files.reload(force=True)
    assert files.http_context() is context, "the listening context stays; each handshake gets the new one"
