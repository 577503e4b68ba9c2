"""tritonclient.http, a V2 client we did not write, against the example server (JSON tensors)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import EXAMPLES, ServerProcess

REPO = EXAMPLES / "model_repository"


@pytest.fixture
def client(example_server: ServerProcess):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{example_server.port}")
    yield client
    client.close()


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert client.get_server_metadata()["name"] == "edgeinfer"
    metadata = client.get_model_metadata("simple")
    assert metadata["versions"] == ["1", "2"]
    assert metadata["inputs"][0]["name"] == "INPUT0"


def test_infer_json_matches_onnxruntime(client):
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    result = client.infer("simple", [tensor], model_version="1", outputs=[wanted], request_id="tc-1")
    session = ort.InferenceSession(str(REPO / "simple" / "1" / "model.onnx"))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), session.run(None, {"INPUT0": x})[0])
    response = result.get_response()
    assert (response["id"], response["model_version"]) == ("tc-1", "1")


def test_bytes_with_tritonclient(client):
    text = np.array([b"ABC", b"dEf"], dtype=object)
    tensor = httpclient.InferInput("TEXT", [2], "BYTES")
    tensor.set_data_from_numpy(text, binary_data=False)
    result = client.infer(
        "text_lower", [tensor], outputs=[httpclient.InferRequestedOutput("LOWER", binary_data=False)]
    )
    # tritonclient turns JSON BYTES data into str elements
    assert result.as_numpy("LOWER").tolist() == ["abc", "def"]


def test_errors_reach_the_client_with_the_message(client):
    x = np.zeros((1, 15), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 15], "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    with pytest.raises(InferenceServerException, match=r"shape \[1, 15\].*expects \[-1, 16\]"):
        client.infer(
            "simple", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
        )
    with pytest.raises(InferenceServerException, match="unknown model 'missing'"):
        client.get_model_metadata("missing")
