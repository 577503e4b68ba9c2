"""bench/loadgen.py against a small server of the test's own that answers 429 after a set delay: what
it counts, and the refusals' latency from when each was due and from when it was sent."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np
import pytest

from bench import loadgen
from tests.stub_http import stub_server

DELAY_S = 0.002


REFUSAL = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\n\r\nno"


@pytest.fixture
def refuser() -> Iterator[int]:
    """Answers each request (no body) with a 429 after ``DELAY_S``."""
    with stub_server(lambda head: REFUSAL, DELAY_S) as port:
        yield port


def test_refusals_are_timed_from_when_they_were_due_and_from_when_they_were_sent(refuser: int):
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    result = loadgen.run_step(refuser, request, 200.0, 1.0, drain_s=1.0, warmup_s=0.2)
    assert result.sent == 200
    assert result.handled == 240  # every answer the server gave over the step, the warmup's 40 included
    assert len(result.refused_latency) == len(result.refused_after_send) == 200
    assert result.errors == 0
    assert len(result.ok_latency) == 0
    assert np.all(result.refused_after_send >= DELAY_S)
    assert np.all(result.refused_after_send <= result.refused_latency)  # sent at or after it was due
    # the client reads an answer only after its own write of the request returned
    assert 0.0 < result.client_write_p99_s <= float(result.refused_after_send.max())
    assert result.refused_after_send_p(0.5) == pytest.approx(
        float(np.median(result.refused_after_send)), rel=1e-9
    )
    # the machine's and the client's CPU over the step: the client ran (it sent 240 requests in
    # 1.2 s), and could not have used more than every core
    assert 0.0 < result.client_cores <= os.cpu_count()  # type: ignore[operator]
    assert math.isnan(result.host_busy) or 0.0 < result.host_busy <= 1.0


BODY_BYTES = 16 << 20  # more than the kernel's socket buffers take while the server does not read
DROP_AFTER_S = 1.0


def test_a_connection_refused_before_its_body_was_written_is_not_reused_until_it_is():
    """The server refuses each request from its headers and reads (drops) its body only a second later.
    Eight requests in a second on four connections opened beforehand: the fifth on would have waited
    behind an earlier request's unread body, the way no HTTP/1.1 client sends; each gets a connection
    of its own, and every refusal comes at once."""
    head = f"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {BODY_BYTES}\r\n\r\n".encode()
    request = head + bytes(BODY_BYTES)
    with stub_server(lambda _: REFUSAL, drop_after_s=DROP_AFTER_S) as port:
        result = loadgen.run_step(port, request, 8.0, 1.0, drain_s=1.0, warmup_s=0.0)
    assert result.sent == 8
    assert len(result.refused_latency) == 8
    assert result.errors == result.unanswered == 0
    assert float(result.refused_latency.max()) < DROP_AFTER_S / 4


def test_requests_go_out_at_their_time_never_before_and_the_client_sleeps_between_them(refuser: int):
    """The engine waits for each request's time without spinning a core (the cores it has are the
    server's too), and sends none before it is due."""
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    result = loadgen.run_step(refuser, request, 20.0, 1.0, drain_s=1.0, warmup_s=0.0)
    assert result.sent == len(result.refused_latency) == 20
    sent_after_due = result.refused_latency - result.refused_after_send
    assert np.all(sent_after_due >= 0)
    assert result.client_cores < 0.25  # slept through the 50 ms gaps: polling them takes a whole core


def test_the_engine_is_built_again_when_its_source_changes(tmp_path, monkeypatch: pytest.MonkeyPatch):
    source = tmp_path / "openloop.c"
    source.write_bytes(loadgen.ENGINE_SOURCE.read_bytes())
    monkeypatch.setattr(loadgen, "ENGINE_SOURCE", source)
    monkeypatch.setattr(loadgen, "BUILT", tmp_path / "built")
    first = loadgen.engine()
    assert loadgen.engine() == first  # built once
    source.write_bytes(source.read_bytes() + b"\n/* edited */\n")
    edited = loadgen.engine()
    assert edited != first
    assert os.access(first, os.X_OK)
    assert os.access(edited, os.X_OK)
    assert sorted(path.name for path in (tmp_path / "built").iterdir()) == sorted([first.name, edited.name])


def test_without_a_c_compiler_the_engine_says_what_it_needs(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(loadgen, "BUILT", tmp_path / "built")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(RuntimeError, match=r"built with a C compiler: .*no-such-compiler was not found"):
        loadgen.engine()
