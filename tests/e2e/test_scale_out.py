"""Scale-out: three replicas (separate server processes) behind nginx, all reading one S3 repository
(moto's server) with polling, under steady HTTP and gRPC load from several clients.

nginx runs the shipped deploy/nginx/edgeinfer.conf, with only its upstream servers and listen ports
replaced by the test's. What clients must never see: an error while a replica is killed (SIGKILL), while
one is stopped (SIGTERM), or while a new model version rolls out to every replica.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pytest

from tests.support import ROOT, ServerProcess, free_port, infer_body, matmul_model, request, scrape, wait_for

pytestmark = pytest.mark.deploy

AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
POLL_INTERVAL_S = 0.5
ONE_ROW = orjson.dumps(infer_body({"X": np.ones((1, 16), np.float32)}))
SHIPPED = ROOT / "deploy" / "nginx" / "edgeinfer.conf"
# nginx streams gRPC request bodies to the replica instead of keeping them, so it cannot replay a call a
# replica took and then lost (killed, or a stream caught in its GOAWAY): the retry that HTTP gets from
# nginx, gRPC clients get from gRPC's own retry policy (inference is idempotent). docs/deployment.md.
GRPC_RETRY_POLICY = {
    "methodConfig": [{
        "name": [{"service": "inference.GRPCInferenceService"}],
        "retryPolicy": {
            "maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s", "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
        },
    }]
}  # fmt: skip
GRPC_RETRY_OPTIONS = [
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(GRPC_RETRY_POLICY)),
    ("grpc.max_send_message_length", 64 * 2**20),
    ("grpc.max_receive_message_length", 64 * 2**20),
]


def nginx_site(http_ports: list[int], grpc_ports: list[int], listen_http: int, listen_grpc: int) -> str:
    """The shipped site with the test's replicas and ports; each replacement must match exactly once."""
    text = SHIPPED.read_text()
    for upstream, ports in (("edgeinfer_http", http_ports), ("edgeinfer_grpc", grpc_ports)):
        block = re.search(rf"upstream {upstream} \{{\n(.*?)\n\}}", text, flags=re.DOTALL)
        assert block is not None, f"no upstream {upstream} in {SHIPPED}"
        servers = re.findall(r"^\s*server \S+(.*);$", block.group(1), flags=re.MULTILINE)
        assert servers, f"upstream {upstream} lists no server"
        options = servers[0]
        body = re.sub(r"^\s*server \S+.*;\n?", "", block.group(1), flags=re.MULTILINE)
        listed = "".join(f"    server 127.0.0.1:{port}{options};\n" for port in ports)
        text = text.replace(block.group(0), f"upstream {upstream} {{\n{listed}{body}\n}}")
    for shipped, ours in (("listen 80;", f"listen 127.0.0.1:{listen_http};"),
                          ("listen 81 http2;", f"listen 127.0.0.1:{listen_grpc} http2;")):  # fmt: skip
        assert text.count(shipped) == 1, f"{shipped!r} not found once in {SHIPPED}"
        text = text.replace(shipped, ours)
    return text


TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")  # nginx's defaults are under /var/lib


@dataclass
class Nginx:
    http_port: int
    grpc_port: int
    directory: Path
    process: subprocess.Popen[bytes]

    def finals_after(self, since: float) -> Counter[str]:
        """Each request answered since ``since`` (epoch seconds): the replica that answered it last."""
        finals: Counter[str] = Counter()
        for line in (self.directory / "access.log").read_text().splitlines():
            stamp, _status, upstreams = line.split(" ", 2)
            if float(stamp) >= since:
                finals[upstreams.replace(" : ", ", ").split(", ")[-1]] += 1
        return finals


def start_nginx(directory: Path, http_ports: list[int], grpc_ports: list[int]) -> Nginx:
    directory.mkdir(parents=True, exist_ok=True)
    listen_http, listen_grpc = free_port(), free_port()
    user = "user root;\n" if os.geteuid() == 0 else ""
    (directory / "nginx.conf").write_text(
        f"{user}worker_processes 1;\npid {directory}/nginx.pid;\nerror_log {directory}/error.log warn;\n"
        "events { worker_connections 1024; }\nhttp {\n"
        "    log_format replicas '$msec $status $upstream_addr';\n"
        f"    access_log {directory}/access.log replicas;\n"
        + "".join(f"    {kind}_temp_path {directory}/{kind};\n" for kind in TEMP_PATHS)
        + nginx_site(http_ports, grpc_ports, listen_http, listen_grpc)
        + "\n}\n"
    )  # fmt: skip
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    command = [nginx, "-p", str(directory), "-c", str(directory / "nginx.conf"), "-g", "daemon off;"]
    checked = subprocess.run([*command[:-2], "-t"], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: _answers(listen_http), timeout=10, what="nginx answering")
    return Nginx(listen_http, listen_grpc, directory, process)


def _answers(port: int) -> bool:
    try:
        return request(port, "GET", "/v2/health/live", timeout=2).status == 200
    except OSError:
        return False


@dataclass
class Load:
    """Clients sending inference through nginx until stopped: HTTP (keep-alive) and gRPC threads."""

    http_port: int
    grpc_port: int
    http_clients: int = 4
    grpc_clients: int = 2
    grpc_retries: bool = False
    statuses: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Load:
        for index in range(self.http_clients):
            self._threads.append(threading.Thread(target=self._http, name=f"http-{index}", daemon=True))
        for index in range(self.grpc_clients):
            self._threads.append(threading.Thread(target=self._grpc, name=f"grpc-{index}", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def _record(self, outcome: str, version: str | None, failure: str | None = None) -> None:
        with self._lock:
            self.statuses[outcome] += 1
            if version is not None:
                self.versions[version] += 1
            if failure is not None:
                self.failures.append(failure)

    def _http(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
        while not self._stop.is_set():
            try:
                connection.request(
                    "POST", "/v2/models/m/infer", ONE_ROW, {"Content-Type": "application/json"}
                )
                response = connection.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as error:
                self._record("http-exception", None, f"http: {error!r}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=30)
                continue
            if response.status == 200:
                self._record("http-200", orjson.loads(body)["model_version"])
            else:
                self._record(f"http-{response.status}", None, f"http {response.status}: {body[:200]!r}")
        connection.close()

    def _grpc(self) -> None:
        import tritonclient.grpc as grpcclient

        options = GRPC_RETRY_OPTIONS if self.grpc_retries else None
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{self.grpc_port}", channel_args=options)
        tensor = grpcclient.InferInput("X", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        while not self._stop.is_set():
            try:
                result = client.infer("m", [tensor], client_timeout=30)
            except Exception as error:  # every failure counts, whatever the client raises
                detail = getattr(error, "status", lambda: "")(), getattr(error, "message", lambda: "")()
                self._record("grpc-error", None, f"grpc: {error!r} {detail}")
                continue
            self._record("grpc-ok", result.get_response().model_version)
        client.close()


@pytest.fixture(scope="module")
def s3() -> Iterator[tuple[str, object]]:
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {key: os.environ.get(key) for key in AWS_ENV}
    os.environ.update(AWS_ENV)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="models")
    yield endpoint, client
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@dataclass
class Cluster:
    replicas: list[ServerProcess]
    nginx: Nginx
    client: object
    models: Path

    def live(self) -> list[ServerProcess]:
        return [r for r in self.replicas if r.process is not None and r.process.poll() is None]


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        pytest.skip("nginx is not installed (make system-packages installs it)")
    endpoint, client = s3
    root = tmp_path_factory.mktemp("scale_out")
    models = root / "models"
    matmul_model(models / "v1.onnx", seed=1)
    matmul_model(models / "v2.onnx", seed=2)
    client.upload_file(str(models / "v1.onnx"), "models", "edge/m/1/model.onnx")
    replicas = []
    for index in range(3):
        config = root / f"replica{index}.yaml"
        config.write_text(
            "model_store_path: s3://models/edge\n"
            f"repository: {{poll_interval_s: {POLL_INTERVAL_S}, cache_dir: {root / f'cache{index}'},"
            f" s3_endpoint_url: '{endpoint}'}}\n"
            "server: {shutdown_delay_s: 1.0}\n"
            "logging: {access_log: false}\n"
        )
        replicas.append(ServerProcess(["--config", str(config)], env=AWS_ENV))
    try:
        for index, replica in enumerate(replicas):
            replica.start(root / f"replica{index}.log", timeout=60)
        nginx = start_nginx(root / "nginx", [r.port for r in replicas], [r.grpc_port for r in replicas])
    except BaseException:
        for replica in replicas:
            replica.stop()
        raise
    yield Cluster(replicas, nginx, client, models)
    nginx.process.terminate()
    nginx.process.wait(timeout=10)
    for replica in replicas:
        replica.stop()


def _report(what: str, load: Load) -> None:
    print(f"\n{what}: {load.total} requests ({dict(load.statuses)}), versions {dict(load.versions)}")


def test_a_new_version_reaches_every_replica_without_an_error(cluster: Cluster):
    replicas = cluster.live()
    with Load(cluster.nginx.http_port, cluster.nginx.grpc_port) as load:
        wait_for(lambda: load.total >= 50, timeout=30, what="load flowing")
        uploaded = time.monotonic()
        cluster.client.upload_file(str(cluster.models / "v2.onnx"), "models", "edge/m/2/model.onnx")
        reached: dict[int, float] = {}
        while len(reached) < len(replicas) and time.monotonic() - uploaded < 60:
            for replica in replicas:
                if replica.port not in reached and _version_ready(replica.port, "2"):
                    reached[replica.port] = time.monotonic() - uploaded
            time.sleep(0.02)
        settled = load.total
        wait_for(lambda: load.total >= settled + 50, timeout=30, what="load after the rollout")
    _report("rollout", load)
    assert load.failures == []
    assert set(load.versions) == {"1", "2"}, "requests were answered by both versions, and only by them"
    assert len(reached) == len(replicas), f"version 2 did not reach every replica: {reached}"
    for replica in replicas:  # within one poll interval, the replica's own load and warmup, and 3 s of slack
        samples = scrape(replica.port)
        labels = (("model", "m"), ("version", "2"))
        loading = samples["edgeinfer_model_load_duration_seconds"][labels]
        loading += samples["edgeinfer_model_warmup_duration_seconds"][labels]
        print(f"replica :{replica.port}: version 2 ready {reached[replica.port]:.2f} s after the upload "
              f"(its load + warmup {loading:.3f} s)")  # fmt: skip
        assert reached[replica.port] <= POLL_INTERVAL_S + loading + 3.0


def _version_ready(port: int, version: str) -> bool:
    try:
        return request(port, "GET", f"/v2/models/m/versions/{version}/ready", timeout=2).status == 200
    except OSError:
        return False


def _ready_status(port: int) -> int | None:
    try:
        return request(port, "GET", "/v2/health/ready", timeout=2).status
    except OSError:
        return None


def test_sigterm_to_a_replica_loses_nothing(cluster: Cluster):
    stopping = cluster.live()[0]
    assert stopping.process is not None
    address = f"127.0.0.1:{stopping.port}"
    with Load(cluster.nginx.http_port, cluster.nginx.grpc_port, grpc_retries=True) as load:
        wait_for(lambda: load.total >= 50, timeout=30, what="load flowing")
        signalled = time.monotonic()
        stopping.process.send_signal(signal.SIGTERM)
        wait_for(lambda: _ready_status(stopping.port) == 503, timeout=2, what="readiness 503 at once")
        not_ready_after = time.monotonic() - signalled
        assert stopping.process.wait(timeout=30) == 0
        exited, exited_at = time.monotonic() - signalled, time.time()
        settled = load.total
        wait_for(  # a hundred requests, over more than the margin below (on a fast box they take less)
            lambda: load.total >= settled + 100 and time.time() > exited_at + 0.5,
            timeout=30,
            what="load after the replica left",
        )
    _report("SIGTERM", load)
    print(f"readiness 503 after {not_ready_after:.3f} s, exit 0 after {exited:.2f} s")
    assert load.failures == []
    finals = cluster.nginx.finals_after(exited_at + 0.05)
    assert finals[address] == 0, f"nginx still had {address} answer after it exited: {finals}"
    assert sum(finals.values()) >= 20, "the access log shows the requests after the exit"


def test_sigkill_to_a_replica_mid_load_loses_nothing(cluster: Cluster):
    survivors = cluster.live()
    assert len(survivors) >= 2, "one replica must be left to take the load"
    victim = survivors[-1]
    assert victim.process is not None
    with Load(cluster.nginx.http_port, cluster.nginx.grpc_port, grpc_retries=True) as load:
        wait_for(lambda: load.total >= 100, timeout=30, what="load flowing")
        before = load.total
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=10)
        wait_for(lambda: load.total >= before + 200, timeout=60, what="load after the kill")
    _report("SIGKILL", load)
    assert load.failures == []
    assert load.statuses["grpc-ok"] > 0
    assert load.statuses["http-200"] > 0
