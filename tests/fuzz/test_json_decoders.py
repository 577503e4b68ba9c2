"""The JSON decoders against each other (Hypothesis), and the real server on the same bodies.

A body is read by orjson when small, by simdjson from ``LARGE_BODY_BYTES`` on, and its long numeric
arrays by the GIL-free scan where that is built: a request's answer must not depend on which one read
it. The bodies are written here as text, so that they hold what JSON allows and encoders rarely write:
integers beyond 64 bits anywhere, a key given twice, numbers spelt every way, and broken JSON.

Properties: on one body every decoder gives the same request or the same message; a body padded past
the large-body threshold (with a field the protocol ignores) gets the same answer as the unpadded
one; and through the real server no body gets a 5xx, and the padded and unpadded bodies get the same
status and message.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from edgeinfer.errors import EdgeInferError
from edgeinfer.protocol import grpc_codec, json_codec, json_scan
from edgeinfer.protocol.grpc_gen import edgeinfer_grpc_v2_pb2 as pb
from tests.fuzz.budget import FUZZ
from tests.support import ServerProcess, examples_server_that_survives, request

DATATYPES = ["BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "UINT32", "UINT64", "FP16", "FP32", "FP64"]
DATATYPES += ["BYTES"]


class Raw(str):
    """JSON text written as it is (a number spelt a particular way, or something that is not JSON)."""


class Pairs(list):
    """A JSON object as its (key, value) pairs, so that a key can appear twice."""


def render(value: Any) -> str:
    """``value`` as JSON text; Python ints of any size are written as integers, as JSON allows."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{render(key)}:{render(item)}" for key, item in value) + "}"
    if isinstance(value, dict):
        return render(Pairs(value.items()))
    if isinstance(value, list):
        return "[" + ",".join(render(item) for item in value) + "]"
    if value is None or isinstance(value, bool):
        return orjson.dumps(value).decode()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return orjson.dumps(value).decode()


BIG = st.one_of(
    st.integers(2**63, 2**64 + 10),
    st.integers(-(2**63) - 10, -(2**63)),
    st.integers(-(2**90), 2**90),
    st.sampled_from([10**20, -(10**20), 2**64, 2**64 - 1, -(2**63) - 1, 10**300]),
)
NUMBER_TEXT = st.sampled_from(
    ["-0", "-0.0", "0e0", "1E5", "1e-5", "2.0", "1e20", "1e308", "1e400", "-1e400", "5e-324", "1e-400"]
).map(Raw)
BAD_TEXT = st.sampled_from(
    ["01", "1.", ".5", "+1", "NaN", "Infinity", "tru", '"\\ud800"', "[1,]", "1 2"]
).map(Raw)
numbers = st.one_of(
    st.integers(-300, 300),
    st.integers(-(2**63), 2**64 - 1),
    BIG,
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    NUMBER_TEXT,
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=6))
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=6), children, max_size=3)
        | st.lists(st.tuples(st.sampled_from(["a", "a", "b"]), children), max_size=3).map(Pairs)
    ),
    max_leaves=12,
)


@st.composite
def tensors(draw: st.DrawFn) -> Any:
    """An input: mostly well formed, with data that fits or nearly fits its shape."""
    count = draw(st.integers(0, 6))
    data: Any = draw(
        st.lists(numbers, min_size=count, max_size=count)
        | st.lists(st.booleans(), min_size=count, max_size=count)
        | st.lists(st.text(max_size=4), min_size=count, max_size=count)
        | st.lists(scalars, min_size=count, max_size=count + 1)
        | values
    )
    shape: Any = draw(
        st.just([count]) | st.just([1, count]) | st.lists(st.integers(-1, 4) | BIG, max_size=3) | values
    )
    fields = [
        ("name", draw(st.sampled_from(["INPUT0", "x", "y", ""]) | values)),
        ("datatype", draw(st.sampled_from(DATATYPES) | values)),
        ("shape", shape),
        ("data", data),
    ]
    if draw(st.booleans()):
        fields.append(("parameters", draw(st.dictionaries(st.sampled_from(["p", "q"]), values, max_size=2))))
    if draw(st.integers(0, 9)) == 0:  # a field twice: the last one is what a JSON parser keeps
        fields.append(draw(st.sampled_from(fields)))
    if draw(st.integers(0, 9)) == 0:
        fields.pop(draw(st.integers(0, len(fields) - 1)))
    return Pairs(fields)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A V2 request body: a generated document, now and then broken or with a field twice."""
    fields = Pairs([("inputs", draw(st.lists(tensors(), max_size=3) | values))])
    if draw(st.booleans()):
        fields.append(("id", draw(st.text(max_size=6) | values)))
    if draw(st.booleans()):
        fields.append(("parameters", draw(st.dictionaries(st.sampled_from(["a", "b"]), values, max_size=3))))
    if draw(st.booleans()):
        outputs = st.lists(st.fixed_dictionaries({"name": values}), max_size=2)
        fields.append(("outputs", draw(outputs | values)))
    if draw(st.integers(0, 9)) == 0:
        fields.append(draw(st.sampled_from(fields)))
    text = render(fields if draw(st.integers(0, 19)) else draw(values))
    if draw(st.integers(0, 9)) == 0:  # broken JSON: a bad token put somewhere
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(BAD_TEXT) + text[at:]
    return text.encode()


def padded(body: bytes) -> bytes | None:
    """``body`` with an ignored field in front that takes it past the large-body threshold; None when
    the body is not an object (there is nowhere to put one)."""
    if not body.startswith(b"{"):
        return None
    pad = b'"pad":"' + b"x" * json_codec.LARGE_BODY_BYTES + b'"'
    return b"{" + pad + (b"," if body[1:].lstrip()[:1] != b"}" else b"") + body[1:]


def outcome(decode: Any, *args: Any) -> Any:
    """What a decoder makes of a body: the request's fields, or its error's type and message. Any
    other exception propagates: it is what the server would answer with a 500."""
    try:
        request = decode(*args)
    except EdgeInferError as error:
        return type(error).__name__, str(error)
    inputs = {
        name: (array.dtype.str, array.shape, array.tolist() if array.dtype == object else array.tobytes())
        for name, array in request.inputs.items()
    }
    outputs = None if request.outputs is None else [(o.name, o.parameters) for o in request.outputs]
    return inputs, request.id, request.parameters, outputs, request.input_parameters


def every_decoder(body: bytes) -> dict[str, Any]:
    answers = {
        "orjson": outcome(json_codec.decode_with_orjson, body),
        "simdjson": outcome(json_codec.decode_with_simdjson, body),
    }
    if json_scan.available():
        with mock.patch.object(json_scan, "MIN_COUNT", 2):
            scanned = json_scan.float32_arrays(body)
        answers["scan"] = outcome(json_codec.decode_request, body, json_codec.MAX_DEPTH, scanned)
    return answers


def without_positions(answer: Any) -> Any:
    """An answer with the parser's position in the body taken out of its message (padding moves it)."""
    if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], str):
        return answer[0], re.sub(r": line \d+ column \d+ \(char \d+\)", "", answer[1])
    return answer


def test_json_scan_is_built_here():
    """The differential test compares three decoders only where the C scan is built (setup.py): a
    machine with a compiler builds it (and CI, where a skip fails, has one)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the scan is optional")
    assert json_scan.available()


@FUZZ
@given(bodies())
@example(b'{"inputs":[{"name":"x","datatype":"INT64","shape":[2],"data":[1,100000000000000000000]}]}')
@example(b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2],"data":[1,100000000000000000000]}]}')
@example(b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,18446744073709551616],"data":[1]}]}')
@example(b'{"parameters":{"a":-9223372036854775809},"inputs":[]}')
@example(b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1],"data":[1]}],"inputs":[]}')
@example(b'{"inputs":[{"name":"x","name":"y","datatype":"FP32","shape":[1],"data":[1]}]}')
def test_every_decoder_gives_the_same_answer_small_or_padded(body: bytes):
    answers = every_decoder(body)
    assert len({repr(answer) for answer in answers.values()}) == 1, answers
    large = padded(body)
    if large is None:
        return
    padded_answers = every_decoder(large)
    assert len({repr(answer) for answer in padded_answers.values()}) == 1, padded_answers
    assert without_positions(padded_answers["orjson"]) == without_positions(answers["orjson"])


def test_a_deep_body_with_a_long_number_is_refused_for_its_depth_by_every_decoder():
    """1,010 levels (orjson reads up to 1,024, Python's own parser stops near 1,000) and a run of 19 digits
    (which a refusal's exact reading looks for): the depth's 400 every way, never Python's RecursionError."""
    body = b'{"id": "1234567890123456789", "inputs": ' + b"[" * 1010 + b"]" * 1010 + b"}"
    for name, answer in every_decoder(body).items():
        assert answer[0] == "LimitExceeded", (name, answer)
        assert "the JSON body is nested" in answer[1], (name, answer)
    large = padded(body)
    assert large is not None
    assert {repr(answer) for answer in every_decoder(large).values()} == {repr(every_decoder(body)["orjson"])}


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("INT64", [1, 10**20], "data does not fit datatype INT64: 100000000000000000000 is outside"),
        ("INT64", [1, -(2**63) - 1], "-9223372036854775809 is outside [-9223372036854775808, "),
        ("UINT64", [1, 2**64], "data does not fit datatype UINT64: 18446744073709551616 is outside [0, "),
        ("INT32", [1, 2**70], "1180591620717411303424 is outside [-2147483648, 2147483647]"),
        ("INT8", [1, 300], "data does not fit datatype INT8: 300 is outside [-128, 127]"),
        ("INT64", [-1, 2**64 - 1], "18446744073709551615 is outside [-9223372036854775808, "),
        ("INT64", [1, Raw("1e20")], "100000000000000000000 is outside [-9223372036854775808, "),  # as 10**20
        ("INT32", [1, 2.5], "data does not fit datatype INT32: the data holds fractional numbers"),
    ],
)
@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_an_integer_a_datatype_cannot_hold_is_named_by_every_decoder(datatype, data, message, large):
    """An integer outside the datatype's range, 64 bits or beyond, is a client error naming it: by the
    ordinary decoder, by simdjson (which cannot hold one beyond 64 bits), padded or not."""
    tensor = {"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}
    body = render({"inputs": [tensor]}).encode()
    body = padded(body) if large else body
    assert body is not None
    for name, answer in every_decoder(body).items():
        assert answer[0] == "InvalidInput", (name, answer)
        assert answer[1].startswith("input 'x': "), (name, answer)
        assert message in answer[1], (name, answer)


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_an_integer_beyond_64_bits_is_the_nearest_float_in_float_data_and_parameters(large):
    """FP32 and FP64 take any JSON number: an integer beyond 64 bits is its nearest double, rounded to
    the datatype (beyond float32's range, inf), as orjson reads it; so is one in ``parameters``."""
    document = {
        "parameters": {"a": 10**20},
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2**70, 10**40]},
            {"name": "y", "datatype": "FP64", "shape": [1], "data": [-(10**30)]},
        ],
    }
    body = render(document).encode()
    body = padded(body) if large else body
    assert body is not None
    for name, answer in every_decoder(body).items():
        inputs, _, parameters, _, _ = answer
        assert parameters == {"a": 1e20}, name
        assert inputs["x"][2] == np.array([1.0, 2.0**70, np.inf], "<f4").tobytes(), name
        assert inputs["y"][2] == np.array([-1e30], "<f8").tobytes(), name


# ---- the real server ----


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with examples_server_that_survives(tmp_path_factory.mktemp("decoders")) as server:
        yield server


def answer(server: ServerProcess, body: bytes) -> tuple[int, Any]:
    reply = request(server.port, "POST", "/v2/models/simple/infer", body, timeout=10)
    assert reply.status < 500, (reply.status, reply.body[:300], body[:300])
    if reply.status >= 400:
        assert reply.error, reply.body[:300]
        return reply.status, without_positions(("", reply.error))[1]
    return reply.status, None


@FUZZ
@given(bodies())
@example(b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,16],"data":[' + b"1," * 15 + b"1e20]}]}")
@example(b'{"inputs":[{"name":"INPUT0","datatype":"INT64","shape":[1,2],"data":[1,100000000000000000000]}]}')
@example(b'{"id": "1234567890123456789", "inputs": ' + b"[" * 1010 + b"]" * 1010 + b"}")
def test_no_body_gets_a_5xx_and_padding_does_not_change_the_answer(server: ServerProcess, body: bytes):
    small = answer(server, body)
    large = padded(body)
    if large is not None:
        assert answer(server, large) == small, body[:300]


@pytest.mark.parametrize(
    ("datatype", "value"),
    [("INT8", 300), ("INT8", -129), ("UINT8", 256), ("INT16", 40000), ("UINT16", 70000)],
)
def test_a_value_a_datatype_cannot_hold_has_one_message_over_json_and_grpc(datatype, value):
    """gRPC's int_contents and uint_contents are 32 bits wide: a value there that the datatype cannot
    hold is refused in the words JSON's data is."""
    tensor = {"name": "x", "datatype": datatype, "shape": [2], "data": [1, value]}
    body = render({"inputs": [tensor]}).encode()
    field = "uint_contents" if datatype.startswith("U") else "int_contents"
    message = pb.ModelInferRequest(
        model_name="m",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="x", datatype=datatype, shape=[2], contents=pb.InferTensorContents(**{field: [1, value]})
            )
        ],
    )
    grpc_answer = outcome(grpc_codec.decode_infer_request, message)
    assert grpc_answer[1].startswith(f"input 'x': data does not fit datatype {datatype}: {value} is outside")
    assert {repr(answer) for answer in every_decoder(body).values()} == {repr(grpc_answer)}
