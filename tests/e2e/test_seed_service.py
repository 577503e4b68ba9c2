"""Seed 001's service, ported as examples/seed_service: an image URL in the request parameters, top 5
labels and scores back, two versions of one name registered from code. The image is served by a local
HTTP server started here (no internet), and the requests are the seed's curl and Python calls."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial

import orjson
import pytest
from PIL import Image

from tests.support import EXAMPLES, free_port, needs_tool, request, wait_ready

SERVICE = EXAMPLES / "seed_service" / "serve.py"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local web server with a mostly blue photo (white borders) and a file that is not an image."""
    root = tmp_path_factory.mktemp("images")
    picture = Image.new("RGB", (120, 80), (250, 250, 250))
    picture.paste((30, 40, 210), (20, 0, 100, 80))  # a blue block in the middle
    picture.save(root / "cat.jpg", quality=95)
    (root / "notes.txt").write_text("not an image")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Files, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    log = (tmp_path_factory.mktemp("seed") / "log").open("wb")
    process = subprocess.Popen(
        [sys.executable, str(SERVICE), str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        assert wait_ready(port, 60, process), "the seed service did not start"
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@needs_tool("curl")
def test_the_seeds_curl_gets_the_top_5(service: int, images: str):
    # as the seed writes it, with a local image instead of Wikimedia's cat
    url = f"http://localhost:{service}/v2/models/resnet18-classifier/versions/1.0/infer"
    body = json.dumps({"parameters": {"url": f"{images}/cat.jpg"}})
    command = ["curl", "-s", "-X", "POST", url, "-H", "Content-Type: application/json", "-d", body]
    answer = orjson.loads(subprocess.run(command, capture_output=True, check=True, timeout=30).stdout)
    assert (answer["model_name"], answer["model_version"]) == ("resnet18-classifier", "1.0")
    [top5] = answer["outputs"]
    assert (top5["name"], top5["datatype"], top5["shape"]) == ("top5", "BYTES", [5])
    assert top5["parameters"] == {"content_type": "str"}
    entries = [json.loads(text) for text in top5["data"]]
    assert [set(entry) for entry in entries] == [{"label", "score"}] * 5
    assert entries[0]["label"] == "blue"
    scores = [entry["score"] for entry in entries]
    assert scores == sorted(scores, reverse=True)
    assert 0.99 < sum(scores) <= 1.0 + 1e-6, "five of six classes: nearly all the probability"


def test_two_versions_of_one_name(service: int, images: str):
    body = {"parameters": {"url": f"{images}/cat.jpg"}}
    answers = {
        version: request(
            service, "POST", f"/v2/models/resnet18-classifier/versions/{version}/infer", body
        ).json()
        for version in ("1.0", "2.0")
    }
    first = {version: json.loads(answer["outputs"][0]["data"][0]) for version, answer in answers.items()}
    assert first["1.0"]["label"] == first["2.0"]["label"] == "blue"
    assert first["2.0"]["score"] > first["1.0"]["score"], "version 2.0 crops the white borders away"
    metadata = request(service, "GET", "/v2/models/resnet18-classifier").json()
    assert metadata["versions"] == ["1.0", "2.0"]
    assert metadata["inputs"] == []
    unversioned = request(service, "POST", "/v2/models/resnet18-classifier/infer", body).json()
    assert unversioned["model_version"] == "2.0", "no version named: the highest"


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({}, "Missing 'url' in request parameters"),
        ({"url": "IMAGES/notes.txt"}, "cannot use the image at IMAGES/notes.txt: cannot identify image file"),
        ({"url": "IMAGES/missing.jpg"}, "cannot use the image at IMAGES/missing.jpg: HTTP Error 404"),
    ],
)
def test_a_bad_url_is_a_400_for_that_request_only(service: int, images: str, parameters: dict, words: str):
    parameters = {key: value.replace("IMAGES", images) for key, value in parameters.items()}
    reply = request(
        service, "POST", "/v2/models/resnet18-classifier/versions/1.0/infer", {"parameters": parameters}
    )
    assert reply.status == 400
    assert words.replace("IMAGES", images) in reply.error
