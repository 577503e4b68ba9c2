"""Every class the request path makes once per request or per batch is a plain class with ``__slots__``
and its own ``__init__`` (compiled, a dataclass's generated ``__init__`` runs interpreted:
docs/design/mypyc.md); the ones a process instance sends to its child, and back, survive pickling."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle

import numpy as np
import pytest

from edgeinfer.batching.jobs import Job
from edgeinfer.batching.policy import Pending
from edgeinfer.head import RequestHead
from edgeinfer.outcome import Outcome, RequestTrace
from edgeinfer.protocol.types import InferRequest, InferResponse, RequestedOutput
from edgeinfer.runners import BatchResult, BatchTimes, Work
from edgeinfer.server.http_messages import Deferred, DoneNow, HttpRequest, HttpResponse
from edgeinfer.server.http_routes import Match


def made() -> list[object]:
    """One of each, as the request path makes them."""
    loop = asyncio.new_event_loop()
    future = loop.create_future()
    work = Work({"x": np.ones((2, 4), np.float32)}, 2, frozenset({"y"}), {"priority": 1}, "id-1", {}, None)
    try:
        return [
            RequestHead("http", "m", None, "id-1", ("00-ab-cd-01", None), "key", "stream", 1.0, 2.0),
            Outcome("http", "m", None, "id-1", 1.0),
            RequestTrace(),
            InferRequest({"x": np.ones((1, 4), np.float32)}, id="id-1", parameters={"priority": 1}),
            InferResponse("m", "1", {"y": np.ones((1, 4), np.float32)}, id="id-1"),
            RequestedOutput("y"),
            HttpRequest("POST", "/v2/models/m/infer", b"", {b"host": b"x"}, b"{}", True, 1.0),
            HttpResponse(200, b"{}"),
            Deferred(future, lambda _: None, None),
            DoneNow(),
            Match(None, ["m"], {}),
            work,
            Job(work, future, None),
            Pending(1, "g", 1.0, 1, None, 0, None, None, None),
            BatchTimes(1, 2, 3, 4),
            BatchResult([{"y": np.ones((1, 4), np.float32)}], BatchTimes(1, 2, 3, 4)),
        ]
    finally:
        loop.close()


@pytest.mark.parametrize("instance", made(), ids=lambda instance: type(instance).__name__)
def test_a_per_request_class_has_slots_and_its_own_init(instance: object):
    cls = type(instance)
    assert not dataclasses.is_dataclass(cls), f"{cls.__name__}: a dataclass's __init__ runs interpreted"
    assert "__slots__" in vars(cls) or not hasattr(instance, "__dict__"), f"{cls.__name__} has no __slots__"
    assert not hasattr(instance, "__dict__"), f"{cls.__name__}'s instances carry a __dict__"
    assert "__init__" in vars(cls), f"{cls.__name__} inherits its __init__"


def _fields(instance: object) -> dict[str, object]:
    slots = [name for klass in type(instance).__mro__ for name in vars(klass).get("__slots__", ())]
    return {name: getattr(instance, name) for name in slots if hasattr(instance, name)}


@pytest.mark.parametrize("kind", [Work, BatchTimes, InferRequest, RequestedOutput])
def test_what_crosses_to_a_process_instance_survives_pickling(kind: type):
    [instance] = [one for one in made() if type(one) is kind]
    copy = pickle.loads(pickle.dumps(instance, protocol=5))
    assert type(copy) is kind
    before, after = _fields(instance), _fields(copy)
    assert before.keys() == after.keys()
    for name, value in before.items():
        np.testing.assert_equal(after[name], value, err_msg=f"{kind.__name__}.{name}")
