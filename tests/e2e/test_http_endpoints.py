"""Every HTTP endpoint of the example server, over plain HTTP, against in-process ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from edgeinfer.protocol.datatypes import v2_datatype
from tests.support import EXAMPLES, NUMERIC_DTYPES, ServerProcess, infer_body, request

REPO = EXAMPLES / "model_repository"


def reference(model: str, version: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(REPO / model / version / "model.onnx"))
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


def test_server_metadata(example_server: ServerProcess):
    reply = request(example_server.port, "GET", "/v2")
    assert reply.status == 200
    body = reply.json()
    assert body["name"] == "edgeinfer"
    assert isinstance(body["version"], str)
    assert isinstance(body["extensions"], list)


def test_health_endpoints(example_server: ServerProcess):
    assert request(example_server.port, "GET", "/v2/health/live").json() == {"live": True}
    assert request(example_server.port, "GET", "/v2/health/ready").json() == {"ready": True}
    reply = request(example_server.port, "GET", "/health")
    assert (reply.status, reply.json()) == (200, {"status": "ready"})


def test_model_metadata_lists_versions_and_tensors(example_server: ServerProcess):
    body = request(example_server.port, "GET", "/v2/models/simple").json()
    assert body == {
        "name": "simple",
        "versions": ["1", "2"],
        "platform": "onnx_onnxv1",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
    }
    versioned = request(example_server.port, "GET", "/v2/models/simple/versions/1").json()
    assert versioned["inputs"] == body["inputs"]


def test_model_ready(example_server: ServerProcess):
    assert request(example_server.port, "GET", "/v2/models/simple/ready").json() == {
        "name": "simple",
        "ready": True,
    }
    reply = request(example_server.port, "GET", "/v2/models/simple/versions/2/ready")
    assert (reply.status, reply.json()["ready"]) == (200, True)
    reply = request(example_server.port, "GET", "/v2/models/nope/ready")
    assert reply.status == 404
    assert "nope" in reply.error


def test_infer_defaults_to_highest_version_and_echoes_id(example_server: ServerProcess):
    x = np.arange(32, dtype=np.float32).reshape(2, 16) / 7
    reply = request(
        example_server.port, "POST", "/v2/models/simple/infer", infer_body({"INPUT0": x}, id="req-42")
    )
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["id"] == "req-42"
    assert (body["model_name"], body["model_version"]) == ("simple", "2")
    [output] = body["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("OUTPUT0", "FP32", [2, 16])
    expected = reference("simple", "2", {"INPUT0": x})["OUTPUT0"]
    np.testing.assert_array_equal(np.array(output["data"], dtype=np.float32).reshape(2, 16), expected)


def test_infer_specific_version(example_server: ServerProcess):
    x = np.ones((1, 16), dtype=np.float32)
    body = request(
        example_server.port, "POST", "/v2/models/simple/versions/1/infer", infer_body({"INPUT0": x})
    ).json()
    assert body["model_version"] == "1"
    expected = reference("simple", "1", {"INPUT0": x})["OUTPUT0"]
    np.testing.assert_array_equal(
        np.array(body["outputs"][0]["data"], dtype=np.float32), expected.reshape(-1)
    )


def test_nested_data_equals_flat_data(example_server: ServerProcess):
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    flat = infer_body({"INPUT0": x})
    nested = {"inputs": [{"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": x.tolist()}]}
    a = request(example_server.port, "POST", "/v2/models/simple/infer", flat).json()
    b = request(example_server.port, "POST", "/v2/models/simple/infer", nested).json()
    expected = reference("simple", "2", {"INPUT0": x})["OUTPUT0"]
    for body in (a, b):
        np.testing.assert_array_equal(
            np.array(body["outputs"][0]["data"], np.float32).reshape(2, 16), expected
        )


COMPUTED_OUTPUTS = {"BOOL": ["NOT_BOOL"], "INT64": ["DOUBLE_INT64"], "FP64": ["FP64_AS_FP16"]}


@pytest.mark.parametrize("name", list(NUMERIC_DTYPES))
def test_every_numeric_datatype_round_trips(example_server: ServerProcess, name: str):
    rng = np.random.default_rng(3)
    inputs = {
        f"IN_{other}": (rng.integers(0, 100, size=(3, 4)) / (3 if other.startswith("FP") else 1)).astype(
            dtype
        )
        for other, dtype in NUMERIC_DTYPES.items()
    }
    wanted = [f"OUT_{name}", *COMPUTED_OUTPUTS.get(name, [])]
    body = infer_body(inputs, outputs=[{"name": output} for output in wanted])
    reply = request(example_server.port, "POST", "/v2/models/all_dtypes/infer", body)
    assert reply.status == 200, reply.body
    outputs = {output["name"]: output for output in reply.json()["outputs"]}
    assert sorted(outputs) == sorted(wanted), "only the requested outputs come back"
    expected = reference("all_dtypes", "1", inputs)
    for output_name in wanted:
        want = expected[output_name]
        got = outputs[output_name]
        assert got["datatype"] == v2_datatype(want.dtype)
        assert got["shape"] == list(want.shape)
        np.testing.assert_array_equal(np.array(got["data"], dtype=want.dtype).reshape(want.shape), want)


def test_bytes_tensors(example_server: ServerProcess):
    body = {"inputs": [{"name": "TEXT", "shape": [3], "datatype": "BYTES", "data": ["HeLLo", "World", ""]}]}
    reply = request(example_server.port, "POST", "/v2/models/text_lower/infer", body)
    assert reply.status == 200, reply.body
    [output] = reply.json()["outputs"]
    assert output == {"name": "LOWER", "datatype": "BYTES", "shape": [3], "data": ["hello", "world", ""]}


def test_v1_models_lists_every_version_with_state(example_server: ServerProcess):
    models = {
        model["name"]: model for model in request(example_server.port, "GET", "/v1/models").json()["models"]
    }
    assert set(models) == {
        "simple", "simple_direct", "all_dtypes", "text_lower", "color_classifier",
        "decode_image", "top_labels", "image_pipeline",
    }  # fmt: skip
    assert models["simple"]["versions"] == [
        {"version": "1", "state": "READY", "reason": ""},
        {"version": "2", "state": "READY", "reason": ""},
    ]


def test_v1_predict_takes_and_returns_v2_bodies(example_server: ServerProcess):
    x = np.ones((1, 16), dtype=np.float32)
    v1 = request(example_server.port, "POST", "/v1/models/simple/predict", infer_body({"INPUT0": x})).json()
    assert (v1["model_name"], v1["model_version"]) == ("simple", "2")
    expected = reference("simple", "2", {"INPUT0": x})["OUTPUT0"]
    np.testing.assert_array_equal(np.array(v1["outputs"][0]["data"], np.float32).reshape(1, 16), expected)
    pinned = request(
        example_server.port, "POST", "/v1/models/simple/versions/1/predict", infer_body({"INPUT0": x})
    ).json()
    assert pinned["model_version"] == "1"
    expected = reference("simple", "1", {"INPUT0": x})["OUTPUT0"]
    np.testing.assert_array_equal(np.array(pinned["outputs"][0]["data"], np.float32).reshape(1, 16), expected)


def test_model_named_in_config_is_served_beside_the_repository(example_server: ServerProcess):
    x = np.ones((1, 16), dtype=np.float32)
    reply = request(
        example_server.port, "POST", "/v2/models/simple_direct/infer", infer_body({"INPUT0": x})
    ).json()
    assert (reply["model_name"], reply["model_version"]) == ("simple_direct", "1")
    expected = reference("simple", "1", {"INPUT0": x})["OUTPUT0"]  # the same file, named in the config
    np.testing.assert_array_equal(np.array(reply["outputs"][0]["data"], np.float32).reshape(1, 16), expected)
