"""Footprint of `edgeinfer serve` on the bundled examples: ready time, idle RSS, installed size.

    python bench/footprint.py [--skip-install-size]

* ready: from starting the process to the first 200 from /v2/health/ready (models loaded and warmed up),
  with the sources' bytecode compiled first, as an installed edgeinfer has it;
* idle RSS: the server's VmRSS once ready, against a bare Python process that only imports ONNX Runtime
  and creates a session for each of the example repository's model files (the floor any Python server
  pays); measured for the repository alone (with and without gRPC) and for `make serve`'s whole config;
* workers: the same repository with `--workers 2`: RSS of the supervisor and of each worker, and what
  an extra worker adds to the whole server, as the growth of the summed PSS (proportional set size:
  shared pages counted once) from `workers: 1` to `workers: 2`;
* per model: idle RSS with an empty repository, then with only the benchmark's `tiny` model and only
  its `cnn` (a 5.5 MiB ResNet-style network): what one model adds, for sizing (docs/deployment.md);
* installed size: a fresh virtual environment with only numpy and onnxruntime (and what they pull in),
  then `pip install .`: the growth is edgeinfer's own cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "examples" / "model_repository"
CONFIG = ROOT / "examples" / "config.yaml"

BARE = """
import glob, sys, onnxruntime as ort
sessions = [ort.InferenceSession(path) for path in sys.argv[1:]]
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")))
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def bare_rss_mib(model_files: list[str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", BARE, *model_files], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip()) / 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_once(grpc: bool, source: list[str], workers: int = 1) -> tuple[float, float, dict[str, float]]:
    """(ready seconds, RSS of the server process, {rss/pss of the supervisor, each worker, pss total})."""
    port = free_port()
    started = time.perf_counter()
    grpc_flags = ["--grpc-port", str(free_port())] if grpc else ["--no-grpc"]
    process = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "serve", *source, "--http-port", str(port),
         *grpc_flags, "--metrics-port", str(free_port()), "--host", "127.0.0.1", "--log-level", "WARNING",
         "--workers", str(workers)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.005)
            if time.perf_counter() - started > 30:
                raise SystemExit("edgeinfer did not become ready")
        ready_s = time.perf_counter() - started
        time.sleep(0.5)
        pids = [process.pid, *children(process.pid)]
        tree = {f"rss_{index}": rss_mib(pid) for index, pid in enumerate(pids)}
        tree["pss_total"] = sum(pss_mib(pid) for pid in pids)
        return ready_s, rss_mib(process.pid), tree
    finally:
        process.terminate()
        process.wait(timeout=20)


def du_mib(path: Path) -> float:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file()) / 2**20


def installed_size_mib() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        venv = Path(folder) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "numpy", "onnxruntime"], check=True)
        base = du_mib(venv)
        subprocess.run([*pip, str(ROOT)], check=True)
        full = du_mib(venv)
    return {"numpy_onnxruntime_mib": round(base, 1), "edgeinfer_adds_mib": round(full - base, 1)}


def per_model_rss(runs: int) -> dict[str, float]:
    """Idle RSS of an empty repository, what the first (tiny) model adds (ONNX Runtime itself, mostly),
    and what the cnn adds next to it."""
    sys.path.insert(0, str(ROOT / "bench"))
    import models  # bench/ is not a package

    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        cases = {
            "empty": [],
            "tiny": [("tiny", models.tiny)],
            "tiny_cnn": [("tiny", models.tiny), ("cnn", models.cnn)],
        }
        rss = {}
        for case, contents in cases.items():
            (root / case).mkdir()
            for name, build in contents:
                build(root / case / name / "1" / "model.onnx")
            source = ["--model-repository", str(root / case)]
            rss[case] = min(serve_once(False, source)[1] for _ in range(runs))
    return {
        "empty_repository": round(rss["empty"], 1),
        "first_model_tiny_adds": round(rss["tiny"] - rss["empty"], 1),
        "cnn_5_5_mib_adds": round(rss["tiny_cnn"] - rss["tiny"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-install-size", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # An installed edgeinfer starts from bytecode (pip compiles at install, the Makefile too); a source
    # file edited since then would be compiled on every start where PYTHONDONTWRITEBYTECODE is set.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "src")], check=True)
    model_files = sorted(str(path) for path in REPO.glob("*/*/model.onnx"))
    bare = bare_rss_mib(model_files)
    result: dict[str, object] = {"bare_onnxruntime_rss_mib": round(bare, 1)}
    cases = {
        # the ONNX example models alone: what a bare Python process with the same sessions is compared to
        "onnx_examples_http_only": (["--model-repository", str(REPO)], False),
        "onnx_examples_http_and_grpc": (["--model-repository", str(REPO)], True),
        # `make serve`'s whole config, with the Python image pipeline (Pillow and all)
        "make_serve_config": (["--config", str(CONFIG)], True),
    }
    for label, (source, grpc) in cases.items():
        runs = [serve_once(grpc, source) for _ in range(args.runs)]
        rss = min(rss for _, rss, _ in runs)
        result[label] = {
            "ready_s": [round(ready, 3) for ready, _, _ in runs],
            "idle_rss_mib": round(rss, 1),
            "rss_ratio": round(rss / bare, 2),
        }
    # workers: what the second worker costs the box
    source = ["--model-repository", str(REPO)]
    one = [serve_once(False, source, workers=1) for _ in range(args.runs)]
    two = [serve_once(False, source, workers=2) for _ in range(args.runs)]
    single_pss = min(tree["pss_total"] for _, _, tree in one)
    best = min(two, key=lambda run: run[2]["pss_total"])
    result["onnx_examples_http_only_workers_2"] = {
        "ready_s": [round(ready, 3) for ready, _, _ in two],
        "supervisor_rss_mib": round(best[2]["rss_0"], 1),
        "worker_rss_mib": [round(best[2][f"rss_{index}"], 1) for index in (1, 2)],
        "pss_total_mib": round(best[2]["pss_total"], 1),
        "pss_total_workers_1_mib": round(single_pss, 1),
        "second_worker_adds_mib": round(best[2]["pss_total"] - single_pss, 1),
        "target_mib": round(bare + 35, 1),  # the bare ONNX Runtime memory of its models + 35 MiB
    }
    result["per_model_rss_mib"] = per_model_rss(args.runs)
    if not args.skip_install_size:
        result.update(installed_size_mib())
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
