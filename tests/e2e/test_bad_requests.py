"""Bad requests get the right status and a message naming the problem; the server keeps serving."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from tests.support import NUMERIC_DTYPES, ServerProcess, infer_body, request

X16 = list(range(16))


def tensor(name="INPUT0", shape=(1, 16), datatype="FP32", data=None):
    return {"name": name, "shape": list(shape), "datatype": datatype, "data": X16 if data is None else data}


BAD_REQUESTS = [
    # (case, method, path, body, status, words the message must contain)
    ("malformed JSON", "POST", "/v2/models/simple/infer", b'{"inputs": [', 400, "not valid JSON"),
    ("body is a list", "POST", "/v2/models/simple/infer", b"[1, 2]", 400, "must be a JSON object"),
    ("empty body", "POST", "/v2/models/simple/infer", b"", 400, "empty"),
    (  # valid for a model that takes no inputs (parameters only), not for this one
        "no inputs",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": []},
        400,
        "model 'simple' needs input(s) 'INPUT0'",
    ),
    (
        "inputs left out",
        "POST",
        "/v2/models/simple/infer",
        {"parameters": {"url": "x"}},
        400,
        "model 'simple' needs input(s) 'INPUT0'",
    ),
    ("inputs not a list", "POST", "/v2/models/simple/infer", {"inputs": 5}, 400, "'inputs' must be a list"),
    (  # an unknown field is ignored, so a misspelt 'inputs' leaves the request without inputs
        "misspelt inputs",
        "POST",
        "/v2/models/simple/infer",
        {"input": [tensor()]},
        400,
        "model 'simple' needs input(s) 'INPUT0'",
    ),
    (
        "missing input",
        "POST",
        "/v2/models/all_dtypes/infer",
        {"inputs": [tensor("IN_FP32", (1, 4), data=[1, 2, 3, 4])]},
        400,
        "needs input(s) 'IN_BOOL'",
    ),
    (
        "extra input",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(), tensor("EXTRA")]},
        400,
        "unknown input(s) 'EXTRA'; model 'simple' has inputs",
    ),
    (
        "duplicate input",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(), tensor()]},
        400,
        "input 'INPUT0' appears more than once",
    ),
    (
        "wrong datatype",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(datatype="INT32")]},
        400,
        "input 'INPUT0' has datatype INT32 but model 'simple' expects FP32",
    ),
    (
        "unknown datatype",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(datatype="FLOAT")]},
        400,
        "unknown datatype 'FLOAT'",
    ),
    (
        "shape the model does not take",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(shape=(2, 8))]},
        400,
        "input 'INPUT0' has shape [2, 8] but model 'simple' expects [-1, 16]",
    ),
    (
        "shape does not match data length",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(shape=(2, 16))]},
        400,
        "shape [2, 16] needs 32 elements but 'data' has 16",
    ),
    (
        "huge declared shape, little data",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(shape=(1_000_000_000, 16))]},
        400,
        "needs 16000000000 elements but 'data' has 16",
    ),
    (
        "nested data of the wrong size",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(shape=(2, 16), data=[X16])]},
        400,
        "'data' has 1 elements at depth 0 but shape [2, 16] says 2",
    ),
    (
        "negative dimension",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(shape=(-1, 16))]},
        400,
        "'shape' must be a list of non-negative integers",
    ),
    (
        "data that is not numbers",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(data=["a"] * 16)]},
        400,
        "input 'INPUT0': data does not fit datatype FP32",
    ),
    (
        "a number as a string",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(data=[*range(15), "15"])]},
        400,
        "input 'INPUT0': data does not fit datatype FP32: the data holds strings",
    ),
    (
        "a null among numbers",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(data=[*range(15), None])]},
        400,
        "input 'INPUT0': data does not fit datatype FP32: the data holds nulls, objects or a mix of kinds",
    ),
    (  # booleans, an object, a list among numbers: not taken by the one-call path for FP32 data
        "booleans for numbers",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(data=[True] * 16)]},
        400,
        "input 'INPUT0': data does not fit datatype FP32: the data holds booleans",
    ),
    (
        "an object among numbers",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(data=[*range(15), {"a": 1}])]},
        400,
        "input 'INPUT0': data does not fit datatype FP32: the data holds nulls, objects or a mix of kinds",
    ),
    (
        "a list among numbers",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(data=[*range(15), [1.0]])]},
        400,
        "input 'INPUT0': data does not fit datatype FP32: setting an array element with a sequence",
    ),
    (
        "a fraction for an integer",
        "POST",
        "/v2/models/all_dtypes/infer",
        {"inputs": [tensor("IN_INT32", (1, 4), "INT32", [1, 2, 3.5, 4])]},
        400,
        "input 'IN_INT32': data does not fit datatype INT32: the data holds fractional numbers",
    ),
    (
        "an integer out of range",
        "POST",
        "/v2/models/all_dtypes/infer",
        {"inputs": [tensor("IN_INT8", (1, 4), "INT8", [1, 2, 300, 4])]},
        400,
        "input 'IN_INT8': data does not fit datatype INT8: 300 is outside [-128, 127]",
    ),
    (
        "a negative integer for an unsigned one",
        "POST",
        "/v2/models/all_dtypes/infer",
        {"inputs": [tensor("IN_UINT64", (1, 4), "UINT64", [-1, 0, 0, 0])]},
        400,
        "input 'IN_UINT64': data does not fit datatype UINT64: -1 is outside [0, 18446744073709551615]",
    ),
    (
        "a float for an integer, even a whole one",
        "POST",
        "/v2/models/all_dtypes/infer",
        {"inputs": [tensor("IN_INT64", (1, 4), "INT64", [1, 2.0, 3, 4])]},
        400,
        "input 'IN_INT64': data does not fit datatype INT64: the data holds fractional numbers",
    ),
    (
        "zero rows",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor(shape=(0, 16), data=[])]},
        400,
        "the batch size (first dimension of every input) must be at least 1",
    ),
    (
        "BYTES given numbers",
        "POST",
        "/v2/models/text_lower/infer",
        {"inputs": [tensor("TEXT", (2,), "BYTES", [1, 2])]},
        400,
        "BYTES elements must be strings",
    ),
    (
        "inputs with different batch sizes",
        "POST",
        "/v2/models/all_dtypes/infer",
        infer_body(
            {
                f"IN_{name}": np.zeros((2 if name == "FP32" else 1, 4), dtype=dtype)
                for name, dtype in NUMERIC_DTYPES.items()
            }
        ),
        400,
        "all inputs must have the same batch size",
    ),
    (
        "unknown requested output",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor()], "outputs": [{"name": "NOPE"}]},
        400,
        "has no output(s) 'NOPE'; its outputs are: 'OUTPUT0'",
    ),
    (
        "id not a string",
        "POST",
        "/v2/models/simple/infer",
        {"id": 7, "inputs": [tensor()]},
        400,
        "'id' must be a string",
    ),
    (
        "bad priority",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor()], "parameters": {"priority": "high"}},
        400,
        "parameter 'priority' must be a non-negative integer",
    ),
    (
        "bad timeout",
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [tensor()], "parameters": {"timeout": -5}},
        400,
        "parameter 'timeout' must be a non-negative number of microseconds",
    ),
    ("unknown model", "POST", "/v2/models/nope/infer", {"inputs": [tensor()]}, 404, "unknown model 'nope'"),
    (
        "unknown version",
        "POST",
        "/v2/models/simple/versions/9/infer",
        {"inputs": [tensor()]},
        404,
        "model 'simple' has no version '9'; its versions are: 1, 2",
    ),
    ("unknown model metadata", "GET", "/v2/models/nope", None, 404, "unknown model 'nope'"),
    ("GET on infer", "GET", "/v2/models/simple/infer", None, 405, "method GET is not allowed here; use POST"),
    ("unknown route", "GET", "/v3/anything", None, 404, "no route for GET /v3/anything"),
    (
        "a key with a NUL character in a large body",  # the simdjson path (found by tests/fuzz)
        "POST",
        "/v2/models/simple/infer",
        {"inputs": [{"\x00": None}], "parameters": {"padding": "x" * 8192}},
        400,
        "inputs[0] needs a 'name' string",
    ),
    *[
        (  # integers beyond 64 bits: 500 from simdjson (BIGINT_ERROR) in a large body, before
            f"an integer beyond 64 bits in {where}, {size} body",
            "POST",
            "/v2/models/all_dtypes/infer",
            b'{"inputs": [{"name": "IN_INT64", "datatype": "INT64", "shape": %s, "data": %s}]%s}'
            % (shape, data, b', "parameters": {"pad": "%s"}' % (b"x" * 8192) if size == "large" else b""),
            400,
            message,
        )
        for where, shape, data, message in [
            (
                "data",
                b"[1, 2]",
                b"[1, 100000000000000000000]",
                "input 'IN_INT64': data does not fit datatype INT64: 100000000000000000000 is outside "
                "[-9223372036854775808, 9223372036854775807]",
            ),
            ("a shape", b"[1, 18446744073709551616]", b"[1]", "shape [1, 18446744073709551616] is too large"),
        ]
        for size in ("small", "large")
    ],
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "words"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_request_then_good_request(example_server: ServerProcess, method, path, body, status, words):
    reply = request(example_server.port, method, path, body)
    assert reply.status == status, reply.body
    assert words in reply.error
    good = request(example_server.port, "POST", "/v2/models/simple/infer", {"inputs": [tensor()]})
    assert good.status == 200


def test_fields_the_protocol_does_not_define_are_ignored(example_server: ServerProcess):
    """KServe's own client sends ``model_name`` (and others send their own extras) in every body."""
    body = {
        "model_name": "simple",
        "id": "k1",
        "inputs": [{**tensor(), "unit": "m/s"}],
        "outputs": [{"name": "OUTPUT0", "hint": 1}],
        "x-vendor": {"a": 1},
    }
    reply = request(example_server.port, "POST", "/v2/models/simple/infer", body)
    assert reply.status == 200, reply.body
    assert reply.json()["id"] == "k1"
    assert [output["name"] for output in reply.json()["outputs"]] == ["OUTPUT0"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v2/models/simple/infer", "POST"),
        ("POST", "/v2/health/ready", "GET"),
        ("DELETE", "/v2/models/simple", "GET"),
        ("GET", "/v2/repository/index", "POST"),
        ("POST", "/v2/ui/state", "GET"),
        ("POST", "/ui", "GET"),
    ],
)
def test_method_not_allowed_names_the_allowed_method(example_server: ServerProcess, method, path, allowed):
    reply = request(example_server.port, method, path, b"{}" if method == "POST" else None)
    assert reply.status == 405
    assert reply.headers["allow"] == allowed
    assert f"method {method} is not allowed here; use {allowed}" in reply.error


def test_declared_content_length_over_the_limit_is_refused_at_once(example_server: ServerProcess):
    with socket.create_connection(("127.0.0.1", example_server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n{"
        )
        reply = b""
        while b"}" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    text = reply.decode()
    assert text.startswith("HTTP/1.1 413")
    assert "larger than the limit of 67108864 bytes" in text
