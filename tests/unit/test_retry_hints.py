"""What a refusal tells the client about retrying: HTTP's Retry-After and retry-after-ms, gRPC's
grpc-retry-pushback-ms (gRFC A6), from the one hint the core measured (``ServerBusy.retry_after_s``)."""

from __future__ import annotations

import pytest

from edgeinfer.errors import (
    InvalidInput,
    ModelNotReady,
    PayloadTooLarge,
    RequestTimeout,
    ServerBusy,
    TooLarge,
)
from edgeinfer.server.grpc_errors import code_for, retry_pushback
from edgeinfer.server.http_errors import response_for_error


@pytest.mark.parametrize(
    ("retry_after_s", "seconds", "milliseconds"),
    [
        (0.0042, b"1", b"5"),  # an SLO refusal: milliseconds, rounded up; the header allows no less than 1 s
        (0.0, b"1", b"1"),  # never "now"
        (0.8, b"1", b"800"),
        (0.02 + 0.01, b"1", b"30"),  # 30.000000000000004 ms: float noise, not a 31st millisecond
        (2.6, b"3", b"2600"),
        (1.0, b"1", b"1000"),  # a full queue's default
    ],
)
def test_a_refusal_for_load_says_when_to_retry_in_seconds_and_ms(retry_after_s, seconds, milliseconds):
    headers = dict(response_for_error(ServerBusy("busy", retry_after_s)).headers)
    assert (headers[b"retry-after"], headers[b"retry-after-ms"]) == (seconds, milliseconds)


@pytest.mark.parametrize(
    ("error", "pushback"),
    [
        (ServerBusy("busy", 0.0042), "5"),
        (ServerBusy("busy", 0.8), "800"),
        (TooLarge("too many rows", "max_rows"), "-1"),  # RESOURCE_EXHAUSTED too, but a retry gets the same
        (PayloadTooLarge("message too large"), "-1"),
        (InvalidInput("bad shape"), None),
        (ModelNotReady("loading"), None),
        (RequestTimeout("deadline passed"), None),
    ],
)
def test_grpc_pushback_follows_the_refusal(error, pushback):
    assert retry_pushback(error, code_for(error)) == pushback
