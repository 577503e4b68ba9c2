"""The status page (/ui) in a real headless browser: Debian's chromium, driven by selenium through
chromedriver, against a real server. Screenshots (desktop and phone widths) are kept in
build/test-artifacts/."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.support import ROOT, ServerProcess, infer_body, matmul_model, request, wait_for

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed (make system-packages installs them)",
)
ARTIFACTS = ROOT / "build" / "test-artifacts"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """The bundled examples, as `make serve` serves them."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    process = ServerProcess(["--config", str(ROOT / "examples" / "config.yaml")])
    process.start(ARTIFACTS / "status-page-server.log")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    yield driver
    driver.quit()


def text_of(browser: object, selector: str) -> str:
    """The text of the first element ``selector`` matches, in one script call: the page redraws its
    cards every poll, so an element found by one call may be gone at the next."""
    script = "const node = document.querySelector(arguments[0]); return node ? node.innerText : '';"
    return str(browser.execute_script(script, selector))  # type: ignore[attr-defined]


def card_text(browser: object, model: str, version: str = "1") -> str:
    return text_of(browser, f'section.model[data-model="{model}:{version}"]')


def requests_per_s(browser: object, model: str, version: str = "1") -> float:
    value = text_of(browser, f'section.model[data-model="{model}:{version}"] dd.rps')
    try:
        return float(value)
    except ValueError:  # not measured yet: the page shows a dash
        return 0.0


def screenshot(browser: object, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / name))  # type: ignore[attr-defined]


def test_the_page_shows_the_models_follows_the_traffic_and_unloads_a_model(server, browser):
    from selenium.webdriver.support.expected_conditions import alert_is_present
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"http://127.0.0.1:{server.port}/ui")
    index = request(server.port, "POST", "/v2/repository/index", {}).json()
    assert len(index) >= 8
    for entry in index:  # every example model and version, each in its own card
        wait_for(
            lambda entry=entry: "READY" in card_text(browser, entry["name"], entry["version"]),
            timeout=20,
            what=f"{entry['name']} {entry['version']} on the page",
        )
    # traffic, including bad requests: the page's rate and its error list follow
    stop = threading.Event()

    def traffic() -> None:
        good = infer_body({"INPUT0": np.ones((2, 16), np.float32)})
        bad = infer_body({"INPUT0": np.ones((2, 8), np.float32)})
        while not stop.is_set():
            request(server.port, "POST", "/v2/models/simple/versions/1/infer", good)
            request(
                server.port, "POST", "/v2/models/simple/versions/1/infer", bad, {"X-Request-ID": "page-bad"}
            )
            time.sleep(0.02)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        wait_for(lambda: requests_per_s(browser, "simple") > 1, timeout=30, what="a request rate on the page")
        wait_for(lambda: "page-bad" in text_of(browser, "#errors"), timeout=10, what="the bad requests' id")
    finally:
        stop.set()
        sender.join()
    assert "p50 / p90 / p99" in card_text(browser, "simple")
    assert "client_error" in card_text(browser, "simple")  # errors of the last minute
    assert "CPU · all nodes" in card_text(browser, "simple")  # where it runs: the coverage measured at load
    screenshot(browser, "status-page.png")

    # unloading through the page: a confirmation first, then the model stops serving
    browser.execute_script(
        "document.querySelector('section.model[data-model=\"text_lower:1\"] button.danger').click()"
    )
    alert = WebDriverWait(browser, 10).until(alert_is_present())
    assert alert.text == "Unload text_lower?"
    alert.accept()
    wait_for(
        lambda: "UNAVAILABLE" in card_text(browser, "text_lower"), timeout=20, what="unloaded on the page"
    )
    assert request(server.port, "GET", "/v2/models/text_lower/ready").status != 200
    text = {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["Hello"]}
    assert request(server.port, "POST", "/v2/models/text_lower/infer", {"inputs": [text]}).status in (
        404,
        503,
    )
    assert "Load" in card_text(browser, "text_lower")

    # a phone's width: nothing wider than the screen
    browser.set_window_size(390, 844)
    time.sleep(0.5)
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    screenshot(browser, "status-page-phone.png")

    severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert severe == []


METRICS_KEY = "status-page-metrics-key-0123456789"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with API keys on: the page's data needs the metrics or the admin role."""
    root = tmp_path_factory.mktemp("status-page-keys")
    matmul_model(root / "matmul.onnx")
    (root / "config.yaml").write_text(
        "models:\n  matmul: {model_path: matmul.onnx}\nserver: {host: 127.0.0.1}\n"
    )
    env = {"EDGEINFER_API_KEYS": f"[{{name: watcher, key: {METRICS_KEY}, roles: [metrics]}}]"}
    process = ServerProcess(["--config", str(root / "config.yaml")], env=env)
    process.start(root / "server.log")
    yield process
    process.stop()


def test_with_keys_the_page_asks_for_one_and_its_role_decides_what_it_may_do(keyed, browser):
    from selenium.webdriver.support.expected_conditions import alert_is_present
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(1280, 900)
    browser.get(f"http://127.0.0.1:{keyed.port}/ui")  # the page itself needs no key: it holds no data
    prompt = WebDriverWait(browser, 20).until(alert_is_present())
    assert "API key" in prompt.text
    prompt.send_keys(METRICS_KEY)
    prompt.accept()
    wait_for(lambda: "READY" in card_text(browser, "matmul"), timeout=20, what="the model, read with the key")
    # the metrics role may watch, not act: unloading is refused and the page says why
    browser.execute_script(
        "document.querySelector('section.model[data-model=\"matmul:1\"] button.danger').click()"
    )
    WebDriverWait(browser, 10).until(alert_is_present()).accept()
    wait_for(
        lambda: "needs role 'admin'" in text_of(browser, "#status"), timeout=10, what="the refusal shown"
    )
    assert "READY" in card_text(browser, "matmul")
    severe = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    # only the two refusals, as the browser logs them: the data before the key, the unload after (the
    # status is read from Chromium's wording, as the port in the logged URL may hold "401" or "403" too)
    statuses = [re.findall(r"status of (\d{3})", message) for message in severe]
    assert statuses == [["401"], ["403"]], severe


def test_the_page_is_one_static_file_with_no_outside_requests(server):
    reply = request(server.port, "GET", "/ui")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    page = reply.body.decode()
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page
    assert Path(ROOT / "src/edgeinfer/server/status.html").read_text() == page
