"""The objects a batch is made of travel to a Python model's process and back by pickle
(``runners/process.py``): hand-written classes (``setup.py``: no dataclasses on the request path), so
each field is checked here rather than left to a generated ``__reduce__``."""

import pickle

import numpy as np

from edgeinfer.protocol.types import InferRequest, InferResponse, RequestedOutput, TensorSpec
from edgeinfer.runners.base import BatchTimes, Work


def test_work_survives_pickle_with_every_field():
    work = Work(
        {"x": np.arange(6, dtype=np.float32).reshape(2, 3)},
        rows=2,
        output_names=frozenset({"y"}),
        parameters={"temperature": 0.5},
        request_id="r-1",
        steps={"detect": 0.01},
        span=None,
    )
    back = pickle.loads(pickle.dumps(work, protocol=5))
    assert type(back) is Work
    np.testing.assert_array_equal(back.inputs["x"], work.inputs["x"])
    assert (back.rows, back.output_names, back.parameters, back.request_id, back.steps, back.span) == (
        2,
        frozenset({"y"}),
        {"temperature": 0.5},
        "r-1",
        {"detect": 0.01},
        None,
    )


def test_work_defaults_give_each_request_its_own_parameters():
    first, second = Work({}), Work({})
    first.parameters["a"] = 1
    assert second.parameters == {}
    assert (first.rows, first.output_names, first.request_id, first.steps, first.span) == (
        1,
        None,
        None,
        None,
        None,
    )


def test_batch_times_survive_pickle():
    back = pickle.loads(pickle.dumps(BatchTimes(1, 2, 3, 4)))
    assert (back.input_ns, back.infer_ns, back.output_ns, back.handover_ns) == (1, 2, 3, 4)
    assert back.total_s == 6e-9


def test_the_protocol_types_survive_pickle_with_every_field():
    """A Python model's process reports its tensors (``TensorSpec``) by pickle; the request and the
    response types are compiled too (``setup.py``), and pickle as they did as dataclasses."""
    spec = TensorSpec("x", "FP32", (-1, 4), content_type="str")
    assert pickle.loads(pickle.dumps(spec, protocol=5)) == spec
    wanted = [RequestedOutput("y", {"binary_data": True})]
    request = InferRequest({"x": np.ones((1, 4), np.float32)}, "r-2", {"a": 1}, wanted, {"x": {"b": 2}})
    back = pickle.loads(pickle.dumps(request, protocol=5))
    np.testing.assert_array_equal(back.inputs["x"], request.inputs["x"])
    assert (back.id, back.parameters, back.input_parameters) == ("r-2", {"a": 1}, {"x": {"b": 2}})
    assert back.outputs is not None
    assert [(o.name, o.parameters) for o in back.outputs] == [("y", {"binary_data": True})]
    response = InferResponse("m", "3", {"y": np.zeros(2)}, "r-2", {"p": 1}, wanted, {"y": {"c": 3}})
    again = pickle.loads(pickle.dumps(response, protocol=5))
    np.testing.assert_array_equal(again.outputs["y"], response.outputs["y"])
    assert (again.model_name, again.model_version, again.id, again.parameters, again.output_parameters) == (
        "m",
        "3",
        "r-2",
        {"p": 1},
        {"y": {"c": 3}},
    )
    assert again.requested is not None
    assert [o.name for o in again.requested] == ["y"]
