"""bench/slo.py's R*: the ramp's steps that kept up are repeated from the highest rate down until one
keeps up again, against a small server of the test's own: it answers one configuration and refuses the
other, as an overloaded server would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bench import slo
from tests.stub_http import stub_server


def _answer(head: bytes) -> bytes:
    """200 if the request's path names ``tiny_b8_w0``, else 429."""
    status = b"200 OK" if b"/tiny_b8_w0/" in head else b"429 Too Many Requests"
    return b"HTTP/1.1 " + status + b"\r\ncontent-length: 2\r\n\r\n{}"


@pytest.fixture
def port() -> Iterator[int]:
    with stub_server(_answer) as port:
        yield port


def test_r_star_is_the_highest_rate_a_repeat_keeps_up_with_again(port: int):
    server = SimpleNamespace(port=port, cpu_s=time.process_time)  # measure_step reads these two
    ramp = [
        slo.RampPoint("tiny", "slo", 300.0, 300.0, 0.5, 1.0, 0, 0.0, 0, 0.1),  # kept up once: not again
        slo.RampPoint("tiny", "b8_w0", 200.0, 200.0, 0.5, 1.0, 0, 0.0, 0, 0.1),
        slo.RampPoint("tiny", "b8_w0", 100.0, 100.0, 0.5, 1.0, 0, 0.0, 0, 0.1),
        slo.RampPoint("tiny", "slo", 400.0, 100.0, 0.5, 1.0, 0, 0.0, 0, 0.1),  # did not keep up
    ]
    points = list(ramp)
    found = slo.confirm_sustainable(server, "tiny", b"", 1.0, 4.0, points)  # type: ignore[arg-type]
    assert found == 200.0
    # a repeat the host or the client disturbed is shown and run once more (``measure_step``): on a busy
    # host (steal over 5 %) there are more points than repeats; those counted are the ones that are not
    repeats = [p for p in points[len(ramp) :] if not p.repeated()]
    assert [(p.config, p.confirms) for p in repeats] == [("slo", 300.0), ("b8_w0", 200.0)]
    assert [p.keeps_up() for p in repeats] == [False, True]
    assert slo.sustainable_rate(points) == 200.0
