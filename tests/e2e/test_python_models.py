"""Python models: batching, per-request errors, async predict, failures, and the programmatic API."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import edgeinfer
from edgeinfer.config import Config
from tests.python_models.models import Doubler
from tests.support import (
    ROOT,
    ServerProcess,
    children,
    free_port,
    infer_body,
    metric,
    request,
    scrape,
    wait_for,
    wait_ready,
)

CONFIG = """
models:
  doubler: {backend: python, model_class: "tests.python_models.models:Doubler", parameters: {factor: 3},
            max_batch_size: 64, max_batch_time: 0.02}
  upper: {backend: python, model_class: "tests.python_models.models:AsyncUpper", max_batch_size: 8}
  wrong: {backend: python, model_class: "tests.python_models.models:WrongCount", max_batch_size: 0}
  summed: {backend: python, model_class: "tests.python_models.models:BatchSum", max_batch_size: 16}
  positive: {backend: python, model_class: "tests.python_models.models:PositiveOnly"}
  complex:
    {backend: python, model_class: "tests.python_models.models:ComplexOutput", warmup: {enabled: false}}
  greeter: {backend: python, model_class: "tests.python_models.models:Greeter", max_batch_size: 8}
  pixels:
    backend: python
    model_class: "tests.python_models.models:PixelLoop"
    kind: process
    instances: 2
    max_batch_size: 8
logging: {format: json}
"""


@pytest.fixture(scope="module")
def python_server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("python")
    (root / "config.yaml").write_text(CONFIG)
    env = {"PYTHONPATH": str(ROOT)}
    server = ServerProcess(["--config", str(root / "config.yaml")], env=env).start(root / "log")
    yield server
    server.stop()


def x_rows(value: float, rows: int = 1) -> dict:
    return infer_body({"x": np.full((rows, 4), value, np.float32)})


def test_concurrent_requests_arrive_in_fewer_larger_predict_calls(python_server):
    with ThreadPoolExecutor(max_workers=20) as pool:
        replies = list(pool.map(lambda i: request(python_server.port, "POST", "/v2/models/doubler/infer",
                                                  x_rows(100 + i, 1 + i % 3)), range(100)))  # fmt: skip
    for index, reply in enumerate(replies):
        assert reply.status == 200, reply.body
        output = reply.json()["outputs"][0]
        assert output["shape"] == [1 + index % 3, 4]
        assert output["data"] == [(100 + index) * 3.0] * (4 * (1 + index % 3))
    stats = request(python_server.port, "GET", "/v2/models/doubler/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 100
    assert stats["execution_count"] < 100, "requests were batched into fewer predict calls"


def test_one_bad_request_in_a_batch_fails_alone(python_server):
    bodies = [x_rows(1.0), {**x_rows(2.0), "parameters": {"fail": True}}, x_rows(3.0)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        replies = list(
            pool.map(lambda b: request(python_server.port, "POST", "/v2/models/doubler/infer", b), bodies)
        )
    assert [reply.status for reply in replies] == [200, 400, 200]
    assert replies[1].error == "this request asked to fail"


def test_a_predict_that_raises_fails_its_batch_and_the_next_works(python_server):
    reply = request(python_server.port, "POST", "/v2/models/doubler/infer", x_rows(13.0))
    assert reply.status == 500
    assert "ValueError: thirteen is unlucky" in reply.error
    assert request(python_server.port, "POST", "/v2/models/doubler/infer", x_rows(1.0)).status == 200


def test_async_predict_and_bytes(python_server):
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ab", "Cd"]}]}
    reply = request(python_server.port, "POST", "/v2/models/upper/infer", body)
    assert reply.status == 200, reply.body
    assert reply.json()["outputs"][0]["data"] == ["AB", "CD"]


def test_wrong_number_of_responses_is_a_clear_error(python_server):
    reply = request(python_server.port, "POST", "/v2/models/wrong/infer", x_rows(1.0))
    assert reply.status == 500
    assert "WrongCount.predict returned 0 responses for a batch of 1 requests" in reply.error


def test_predict_batch_gets_one_concatenated_batch(python_server):
    reply = request(python_server.port, "POST", "/v2/models/summed/infer", x_rows(1.5, 3))
    assert reply.json()["outputs"][0] == {
        "name": "total",
        "datatype": "FP32",
        "shape": [3, 1],
        "data": [6.0] * 3,
    }


def test_metadata_comes_from_the_class(python_server):
    metadata = request(python_server.port, "GET", "/v2/models/doubler").json()
    assert metadata["platform"] == "python"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    bad = request(
        python_server.port, "POST", "/v2/models/doubler/infer", infer_body({"x": np.ones((1, 3), np.float32)})
    )
    assert bad.status == 400
    assert "expects [-1, 4]" in bad.error


def test_the_programmatic_api_in_process():
    settings = {"server": {"http_port": 0, "grpc_port": None, "metrics_port": None, "host": "127.0.0.1"}}

    async def main():
        server = edgeinfer.Server(Config.model_validate(settings))
        server.register(Doubler(factor=5), name="five", version="2", max_batch_size=8, max_batch_time=0.001)
        await server.start()
        try:
            loop = asyncio.get_running_loop()
            body = x_rows(2.0)
            return await loop.run_in_executor(
                None, request, server.http_port, "POST", "/v2/models/five/infer", body
            )
        finally:
            await server.stop()

    reply = asyncio.run(main())
    assert reply.status == 200
    assert reply.json()["model_version"] == "2"
    assert reply.json()["outputs"][0]["data"] == [10.0] * 4


def test_the_readme_example_runs_as_written(tmp_path: Path):
    readme = (ROOT / "README.md").read_text()
    start = readme.index("```python\nimport edgeinfer")
    code = readme[start + len("```python\n") : readme.index("```", start + 10)]
    script = tmp_path / "example.py"
    port = free_port()
    script.write_text(code.replace("http_port=8080", f"http_port={port}, grpc_port=None, metrics_port=None"))
    process = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        assert wait_ready(port, 30), "the README example did not start"
        reply = request(port, "POST", "/v2/models/doubler/infer", x_rows(1.0))
        assert reply.status == 200
        assert reply.json()["outputs"][0]["data"] == [2.0] * 4
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_a_model_that_refuses_the_warmup_zeros_still_loads(python_server):
    """A ModelError answered to synthetic zeros shows the model runs: logged, not fatal."""
    assert "answered the zeros with ModelError: x must be positive; it runs" in python_server.log()
    good = request(python_server.port, "POST", "/v2/models/positive/infer", x_rows(4.0))
    assert good.json()["outputs"][0]["data"] == [2.0] * 4
    bad = request(python_server.port, "POST", "/v2/models/positive/infer", x_rows(0.0))
    assert (bad.status, bad.error) == (400, "x must be positive")


@pytest.mark.parametrize(
    ("model_class", "kind", "words"),
    [
        ("RaisesOnZeros", "thread", "warmup failed at batch size 1: ValueError: a bug, not a bad request"),
        (
            "ForgetsItsOutput",
            "thread",
            "warmup failed at batch size 1: InferenceFailed: ",
        ),  # not the runtime's
        ("DiesOnPredict", "process", "warmup failed at batch size 1: InferenceFailed: "),  # an instance died
    ],
)
def test_a_model_that_raises_or_breaks_on_the_warmup_still_fails_to_load(
    tmp_path: Path, model_class, kind, words
):
    """Only a runtime refusing the synthetic values (ONNX Runtime, OpenVINO) serves a model unwarmed: an
    exception of the model's own code, outputs it cannot give, or a process instance that dies fail the
    load (docs/lifecycle.md)."""
    (tmp_path / "config.yaml").write_text(
        f"models:\n  m: {{backend: python, kind: {kind}, "
        f"model_class: 'tests.python_models.models:{model_class}'}}\n"
    )
    command = [sys.executable, "-m", "edgeinfer", "serve", "--config", str(tmp_path / "config.yaml")]
    command += ["--no-grpc", "--http-port", "0", "--metrics-port", "0"]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert result.returncode == 1, result.stderr
    assert f"model 'm' version 1: {words}" in result.stderr


def test_a_model_without_inputs_reads_parameters_and_answers_json_values(python_server):
    reply = request(python_server.port, "POST", "/v2/models/greeter/infer", {"parameters": {"name": "Ada"}})
    assert reply.status == 200, reply.body
    greeting, length = reply.json()["outputs"]
    assert greeting["parameters"] == {"content_type": "str"}
    *documents, text = greeting["data"]  # structured values are JSON; text stays text
    assert [json.loads(document) for document in documents] == [
        {"hello": "Ada", "letters": ["A", "d", "a"]},
        ["a", "list"],
        3,
    ]
    assert text == "plain text"
    assert "parameters" not in length
    assert length["data"] == [3]
    empty = request(python_server.port, "POST", "/v2/models/greeter/infer", {"inputs": [], "parameters": {}})
    assert (empty.status, empty.error) == (400, "parameter 'name' (a string) is required")
    extra = request(python_server.port, "POST", "/v2/models/greeter/infer", x_rows(1.0))
    assert extra.status == 400
    assert "unknown input(s) 'x'" in extra.error
    metadata = request(python_server.port, "GET", "/v2/models/greeter").json()
    assert metadata["inputs"] == []
    assert metadata["outputs"][0]["parameters"] == {"content_type": "str"}


def test_json_values_reach_tritonclient_over_grpc_and_binary_http(python_server):
    http = httpclient.InferenceServerClient(f"127.0.0.1:{python_server.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{python_server.grpc_port}")
    try:
        over_http = http.infer("greeter", [], parameters={"name": "Bo"})
        over_grpc = grpc.infer("greeter", [], parameters={"name": "Bo"})
    finally:
        http.close()
        grpc.close()
    for result in (over_http, over_grpc):
        assert json.loads(result.as_numpy("greeting")[0]) == {"hello": "Bo", "letters": ["B", "o"]}
    assert over_grpc.get_output("greeting").parameters["content_type"].string_param == "str"
    assert over_http.get_output("greeting")["parameters"]["content_type"] == "str"


def pixel_body(seed: int, rows: int = 2, **parameters) -> dict:
    image = np.random.default_rng(seed).integers(0, 256, (rows, 64, 64)).astype(np.uint8)
    return infer_body({"image": image}, **({"parameters": parameters} if parameters else {}))


def histogram(body: dict) -> list[list[int]]:
    pixels = np.array(body["inputs"][0]["data"], np.uint8).reshape(-1, 64 * 64) >> 6
    return [np.bincount(row, minlength=4).tolist() for row in pixels]


def test_process_instances_load_and_predict_in_their_own_processes(python_server):
    server_pid = python_server.process.pid
    with ThreadPoolExecutor(max_workers=8) as pool:
        bodies = [pixel_body(seed, rows=1 + seed % 3) for seed in range(24)]
        replies = list(
            pool.map(
                lambda body: request(python_server.port, "POST", "/v2/models/pixels/infer", body), bodies
            )
        )
    pids = set()
    for body, reply in zip(bodies, replies, strict=True):
        assert reply.status == 200, reply.body
        histogram_out, pid_out = reply.json()["outputs"]
        assert np.array(histogram_out["data"]).reshape(histogram_out["shape"]).tolist() == histogram(body)
        pids.update(pid_out["data"])  # the pid that ran load() in that instance
    assert len(pids) == 2, "two instances shared the work"
    assert server_pid not in pids
    assert pids <= set(children(server_pid)), "the instances are children of the server"


@pytest.mark.parametrize(("trigger", "how"), [("die", "exit code 3"), ("crash", "killed by signal SIGSEGV")])
def test_an_instance_that_dies_fails_only_its_batch_and_comes_back(python_server, trigger: str, how: str):
    before = set(children(python_server.process.pid))
    reply = request(python_server.port, "POST", "/v2/models/pixels/infer", pixel_body(1, **{trigger: True}))
    assert reply.status == 500
    assert "model pixels: process instance" in reply.error
    assert f"died while running the batch ({how})" in reply.error
    replies = [
        request(python_server.port, "POST", "/v2/models/pixels/infer", pixel_body(seed)) for seed in range(6)
    ]
    assert [r.status for r in replies] == [200] * 6, "the other instance serves meanwhile"
    wait_for(
        lambda: (
            len(set(children(python_server.process.pid))) == 2
            and set(children(python_server.process.pid)) != before
        ),
        what="a new instance",
    )


def test_process_instances_need_an_importable_class(tmp_path: Path):
    script = tmp_path / "serve.py"
    script.write_text(
        "import edgeinfer\n"
        "class Local(edgeinfer.Model):\n"
        "    outputs = [edgeinfer.TensorSpec('y', 'FP32', (-1,))]\n"
        "    def predict(self, requests):\n"
        "        return [{'y': [1.0]} for _ in requests]\n"
        "server = edgeinfer.Server()\n"
        "server.register(Local(), name='local', kind='process', instances=2)\n"
        "server.run(http_port=0, grpc_port=None, metrics_port=None)\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Local is defined in the script being run (__main__)" in result.stderr
    assert "move it into a module" in result.stderr


def test_an_output_of_the_wrong_kind_is_the_same_500_over_both_protocols(python_server):
    """A model's bug (complex numbers for an FP32 output) is a server error on HTTP and gRPC alike,
    named the same way and counted as `error`, never as a success."""
    message = "predict returned output 'y' as complex64 values, but the model declares it FP32"
    reply = request(python_server.port, "POST", "/v2/models/complex/infer", x_rows(1.0))
    assert (reply.status, reply.error) == (500, message)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{python_server.grpc_port}")
    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("complex", [tensor])
    finally:
        client.close()
    assert caught.value.status() == "StatusCode.INTERNAL"
    assert caught.value.message() == message
    samples = scrape(python_server.port)
    for protocol in ("http", "grpc"):
        labels = {"model": "complex", "version": "1", "protocol": protocol, "status": "error"}
        assert metric(samples, "edgeinfer_inference_requests_total", **labels) == 1
    assert not any(
        ("model", "complex") in labels and ("status", "success") in labels
        for labels in samples["edgeinfer_inference_requests_total"]
    )


def test_python_lists_become_the_declared_datatype(python_server):
    reply = request(python_server.port, "POST", "/v2/models/greeter/infer", {"parameters": {"name": "Cy"}})
    [_, length] = reply.json()["outputs"]
    assert (length["datatype"], length["data"]) == ("INT64", [2])
