"""Requests are counted after their answers are written (``afterwards.py``), yet a client that reads its
answer and then asks finds it counted: in the statistics, the metrics and the access log, over HTTP
(the same connection or another) and gRPC."""

from __future__ import annotations

import http.client
import json

import numpy as np
import orjson
import tritonclient.grpc as grpcclient

from tests.support import ServerProcess, access_lines, infer_body, matmul_model, metric, scrape

ROUNDS = 30


def test_a_client_that_got_its_answer_finds_it_counted(tmp_path):
    matmul_model(tmp_path / "matmul.onnx")
    (tmp_path / "config.yaml").write_text(
        "models:\n  matmul: {model_path: matmul.onnx, max_batch_size: 8}\n"
        "logging: {level: INFO, format: json}\n"
    )
    server = ServerProcess(["--config", str(tmp_path / "config.yaml")]).start(tmp_path / "server.log")
    body = orjson.dumps(infer_body({"X": np.ones((1, 16), np.float32)}))
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        for index in range(1, ROUNDS + 1):
            connection.request("POST", "/v2/models/matmul/infer", body)
            answer = connection.getresponse()
            assert (answer.status, bool(answer.read())) == (200, True)
            connection.request("GET", "/v2/models/matmul/stats")
            stats = json.loads(connection.getresponse().read())["model_stats"][0]["inference_stats"]
            assert stats["success"]["count"] == index
            assert len(access_lines(server)) == index
        samples = scrape(server.port)
        requests = "edgeinfer_inference_requests_total"
        labels = {"model": "matmul", "version": "1", "protocol": "http", "status": "success"}
        assert metric(samples, requests, **labels) == ROUNDS

        tensor = grpcclient.InferInput("X", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        for index in range(ROUNDS + 1, 2 * ROUNDS + 1):
            grpc.infer("matmul", [tensor])
            stats = grpc.get_inference_statistics("matmul", as_json=True)["model_stats"][0]
            assert int(stats["inference_stats"]["success"]["count"]) == index
    finally:
        connection.close()
        grpc.close()
        server.stop()
