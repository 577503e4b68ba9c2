"""Request targets split into path and query (``http_messages.split_url``): the same answer whether
parsed or kept from before, and never more than ``URLS_KEPT`` kept, whatever targets clients send."""

from __future__ import annotations

import httptools
import pytest

from edgeinfer.server import http_messages
from edgeinfer.server.http_messages import URLS_KEPT, split_url

TARGETS = [
    (b"/v2/models/m/infer", ("/v2/models/m/infer", b"")),
    (b"/v2/models/m/versions/2/infer?x=1&y=2", ("/v2/models/m/versions/2/infer", b"x=1&y=2")),
    (b"/v2/models/caf%C3%A9/ready", ("/v2/models/caf%C3%A9/ready", b"")),
    (b"http://host:8000/v2/health/live", ("/v2/health/live", b"")),
    (b"/metrics?", ("/metrics", b"")),
    (b"", ("/", b"")),
]


@pytest.mark.parametrize(("target", "split"), TARGETS)
def test_a_target_splits_the_same_parsed_or_kept(target: bytes, split: tuple[str, bytes]):
    assert split_url(target) == split
    assert split_url(target) == split  # the second time from what was kept


def test_targets_kept_stay_bounded_whatever_clients_send():
    for number in range(5 * URLS_KEPT):
        assert split_url(f"/v2/models/m{number}/infer?n={number}".encode()) == (
            f"/v2/models/m{number}/infer",
            f"n={number}".encode(),
        )
        assert len(http_messages._urls_split) <= URLS_KEPT
    assert split_url(b"/v2/models/m/infer") == ("/v2/models/m/infer", b"")


def test_a_malformed_target_is_not_kept_and_fails_each_time():
    for _ in range(2):
        with pytest.raises(httptools.HttpParserInvalidURLError):
            split_url(b"http://[bad")
