"""``Afterwards``: calls queued in one loop iteration are made after it, in order, all of them."""

from __future__ import annotations

import asyncio
import logging

import pytest

from edgeinfer import afterwards
from edgeinfer.afterwards import Afterwards


def test_without_a_running_loop_the_call_is_made_at_once():
    made: list[int] = []
    Afterwards().call(made.append, 1)
    assert made == [1]


def test_calls_wait_for_the_end_of_the_iteration_and_come_in_order():
    async def main() -> list[str]:
        afterwards = Afterwards()
        made: list[str] = []
        loop = asyncio.get_running_loop()

        def answer(name: str) -> None:  # one callback answering requests, as data_received does
            afterwards.call(made.append, f"record {name}")
            made.append(f"write {name}")

        loop.call_soon(answer, "a")
        loop.call_soon(answer, "b")  # the same iteration: its record joins the queued ones
        await asyncio.sleep(0)  # both ran; their records are queued behind them
        made.append("iteration over")
        await asyncio.sleep(0)
        afterwards.call(made.append, "record c")  # a new iteration queues afresh
        await asyncio.sleep(0)
        return made

    assert asyncio.run(main()) == [
        "write a",
        "write b",
        "iteration over",
        "record a",
        "record b",
        "record c",
    ]


def test_one_call_per_iteration_is_scheduled_however_many_records(monkeypatch: pytest.MonkeyPatch):
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        scheduled = 0
        call_soon = loop.call_soon

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal scheduled
            scheduled += 1
            return call_soon(*args, **kwargs)

        monkeypatch.setattr(loop, "call_soon", counting)
        afterwards, made = Afterwards(), []
        for number in range(100):
            afterwards.call(made.append, number)
        await asyncio.sleep(0)
        return scheduled, len(made)

    scheduled, made = asyncio.run(main())
    assert made == 100
    assert scheduled <= 2  # ours, and at most the sleep's own


def test_a_failing_call_is_logged_and_the_others_are_still_made(caplog: pytest.LogCaptureFixture):
    def broken() -> None:
        raise ValueError("bad record")

    async def main() -> list[int]:
        afterwards, made = Afterwards(), []
        afterwards.call(made.append, 1)
        afterwards.call(broken)
        afterwards.call(made.append, 2)
        await asyncio.sleep(0)
        return made

    with caplog.at_level(logging.ERROR, logger="edgeinfer.afterwards"):
        assert asyncio.run(main()) == [1, 2]
    assert "bookkeeping after an answer failed" in caplog.text
    assert "bad record" in caplog.text


def test_flush_makes_every_queued_call_before_a_reader_reads_and_each_only_once():
    """An answer written from a callback (a batch back from a worker thread) queues its records for
    the next iteration, and the loop may read the client's next question, for the statistics, before
    that: whoever reads the records flushes them first."""

    async def main() -> tuple[list[str], list[str]]:
        service, recorder = Afterwards(), Afterwards()  # the service's and a model's, say
        made: list[str] = []
        service.call(made.append, "request counted")
        recorder.call(made.append, "batch counted")
        service.call(made.append, "access log line")
        afterwards.flush()  # the statistics handler, in the same iteration
        seen_by_reader = list(made)
        await asyncio.sleep(0)  # the scheduled runs come: nothing is made twice
        await asyncio.sleep(0)
        return seen_by_reader, made

    seen, made = asyncio.run(main())
    assert seen == ["request counted", "access log line", "batch counted"]
    assert made == seen
