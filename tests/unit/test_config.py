"""Config validation: unknown keys, wrong types, missing files, aliases, CLI overrides."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from edgeinfer import config as config_module
from edgeinfer.config import Config, available_cpus
from edgeinfer.config_file import load_config, parse
from edgeinfer.errors import ConfigError
from edgeinfer.model_config import ModelConfig
from tests.support import matmul_model


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return matmul_model(tmp_path / "m.onnx")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_the_documented_format_loads(tmp_path, model_file):
    path = write(
        tmp_path,
        """
model_store_path: "."
models:
  resnet50:
    model_path: "./m.onnx"
    backend: "onnxruntime"
    version: "1"
    backend_config:
      execution_providers: ["CUDAExecutionProvider", "CPUExecutionProvider"]
      intra_op_num_threads: 4
      inter_op_num_threads: 2
      graph_optimization_level: "all"
    max_batch_size: 16
    batch_timeout_millis: 10
server: {http_port: 8080, grpc_port: 8081, metrics_port: 8082, workers: 1}
logging: {level: "info"}
""",
    )
    config = load_config(path)
    model = config.models["resnet50"]
    assert model.model_path == str(model_file.resolve())
    assert model.backend_config.intra_op_num_threads == 4
    assert (model.max_batch_size, model.batch_timeout_ms) == (16, 10)
    assert config.logging.level == "INFO"
    assert config.model_store_path == str(tmp_path.resolve())


def test_paths_are_relative_to_the_config_file(tmp_path, model_file, monkeypatch):
    path = write(tmp_path, "models:\n  m:\n    model_path: m.onnx\n")
    monkeypatch.chdir("/")
    assert load_config(path).models["m"].model_path == str(model_file.resolve())


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "models:\n  m:\n    model_path: m.onnx\n    max_batchsize: 4\n",
            "models.m.max_batchsize: unknown key",
        ),
        ("serve: {}\n", "serve: unknown key"),
        (
            "models:\n  m:\n    model_path: m.onnx\n    backend_config: {intra_op_num_threads: four}\n",
            "models.m.backend_config.intra_op_num_threads: Input should be a valid integer",
        ),
        (
            "models:\n  m:\n    model_path: m.onnx\n    backend_config: {graph_optimization_level: max}\n",
            "models.m.backend_config.graph_optimization_level: Input should be 'disable', 'basic'",
        ),
        ("models:\n  m:\n    model_path: m.onnx\n    max_batch_size: -1\n", "models.m.max_batch_size"),
        ("models:\n  m:\n    backend: onnxruntime\n", "models.m.model_path: required key is missing"),
        ("models:\n  m:\n    model_path: missing.onnx\n", "missing.onnx does not exist"),
        ("model_store_path: ./nowhere\n", "model_store_path: directory"),
        ("server: {workers: -1}\n", "workers must be 0 or auto"),
        ("server: {workers: many}\n", "server.workers"),
        ("models:\n  m: {model_path: m.onnx, kind: process}\n", "kind: process is for backend: python"),
        (
            "models:\n  m: {backend: python, model_class: 'a:B', instances: 2}\n",
            "instances > 1 needs kind: process",
        ),
        ("models:\n  p: {backend: python}\n", "models.p.model_class: required for backend: python"),
        ("models:\n  p: {backend: pipeline}\n", "models.p.pipeline: required for backend: pipeline"),
        ("models:\n  m: {model_path: 's3://b/m.onnx'}\n", "only local paths and http(s):// URLs"),
        ("model_store_path: gs://bucket/models\n", "remote repositories must be s3:// URLs"),
        ("models:\n  m: {model_path: m.onnx, sha256: abc}\n", "models.m.sha256"),
        ("server: {http_port: 70000}\n", "server.http_port"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("models: [\n", "not valid YAML"),
        (
            "models:\n  m:\n    model_path: m.onnx\n    max_batch_time: 0.1\n    batch_timeout_millis: 5\n",
            "give only one of batch_timeout_millis, max_batch_time",
        ),
        ("models:\n  m: {model_path: m.onnx, slo: {}}\n", "slo needs p99_ms or p95_ms"),
        ("models:\n  m: {model_path: m.onnx, slo: {p99_ms: 0}}\n", "models.m.slo.p99_ms"),
        ("models:\n  m: {model_path: m.onnx, slo: {p99: 50}}\n", "models.m.slo.p99"),
        ("server: {shutdown_delay_s: -1}\n", "server.shutdown_delay_s"),
        ("server: {idle_poll: maybe}\n", "server.idle_poll"),
        ("models:\n  m: {model_path: m.onnx, prefetch_batches: -1}\n", "models.m.prefetch_batches"),
        (
            "models:\n  m: {model_path: m.onnx, fallback: {model: s, enter_p95_ms: 30, exit_p95_ms: 30}}\n",
            "exit_p95_ms (30) must be below enter_p95_ms (30)",
        ),
        (
            "models:\n  m: {model_path: m.onnx, fallback: {model: s, exit_p95_ms: 3}}\n",
            "fallback.enter_p95_ms",
        ),
        (
            "models:\n  m: {model_path: m.onnx, fallback: {model: m, enter_p95_ms: 9, exit_p95_ms: 3}}\n",
            "model 'm' names itself as its fallback",
        ),
        (
            "models:\n  m: {model_path: m.onnx, fallback: {model: s, enter_p95_ms: 9, exit_p95_ms: 3, "
            "enter_after: 1}}\n",
            "models.m.fallback.enter_after: unknown key",
        ),
        ("models:\n  m: {model_path: m.onnx, min_ep_coverage: 1.5}\n", "models.m.min_ep_coverage"),
        (
            "models:\n  m: {model_path: m.onnx, backend_config: {performance_hint: FAST}}\n",
            "models.m.backend_config.performance_hint",
        ),
        (
            "models:\n  p:\n    backend: pipeline\n    pipeline:\n      inputs: []\n      outputs: []\n"
            "      steps: [{name: s, model: m, inputs: {}, budget_ms: 0}]\n",
            "models.p.pipeline.steps.0.budget_ms",
        ),
    ],
)
def test_config_errors_name_the_key(tmp_path, model_file, text, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert words in str(caught.value)
    assert str(path) in str(caught.value)


def test_adaptive_batching_unless_a_fixed_timeout_without_slo(tmp_path, model_file):
    path = write(
        tmp_path,
        "models:\n  plain: {model_path: m.onnx}\n  fixed: {model_path: m.onnx, batch_timeout_ms: 2}\n"
        "  both: {model_path: m.onnx, batch_timeout_ms: 2, slo: {p95_ms: 40}}\n"
        "  a: {model_path: m.onnx, prefetch_batches: 0}\n"
        "  f: {model_path: m.onnx, batch_timeout_ms: 2, prefetch_batches: 2}\n",
    )
    models = load_config(path).models
    assert [models[name].adaptive_batching for name in ("plain", "fixed", "both")] == [True, False, True]
    assert models["both"].slo is not None
    assert models["both"].slo.target_s == pytest.approx(0.040)
    # adaptive batching forms the next batch ahead by default (while merging does not pay); fixed does not
    assert [models[name].batches_ahead for name in ("plain", "fixed", "both")] == [1, 0, 1]
    assert (models["a"].batches_ahead, models["f"].batches_ahead) == (0, 2)  # a given one is kept


def test_batch_timeout_aliases(tmp_path, model_file):
    path = write(tmp_path, "models:\n  a:\n    model_path: m.onnx\n    max_batch_time: 0.1\n")
    assert load_config(path).models["a"].batch_timeout_ms == pytest.approx(100)
    path = write(tmp_path, "models:\n  a:\n    model_path: m.onnx\n    max_queue_delay_ms: 3\n")
    assert load_config(path).models["a"].batch_timeout_ms == 3


def test_cli_overrides_win_over_the_file(tmp_path, model_file):
    path = write(tmp_path, "server: {http_port: 1234}\nlogging: {level: INFO}\n")
    config = load_config(path, {"server.http_port": 9999, "logging.level": "debug", "server.grpc_port": None})
    assert config.server.http_port == 9999
    assert config.logging.level == "DEBUG"
    assert config.server.grpc_port is None
    assert config.server.host == "0.0.0.0"


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("written", "available", "chosen"),
    [
        (None, [1, 2, 3], [3]),
        ({"latest": 2}, [3, 1, 2], [2, 3]),
        ("all", [2, 1], [1, 2]),
        ({"specific": [1, 3]}, [1, 2, 3], [1, 3]),
    ],
)
def test_version_policies(written, available, chosen):
    config = ModelConfig.model_validate({} if written is None else {"version_policy": written})
    assert config.version_policy.select(available) == chosen


@pytest.mark.parametrize(
    ("policy", "held", "loaded"),
    [
        ("{latest: 1}", None, ["3"]),
        ("{latest: 1}", "3", ["2", "3"]),  # a canary of 3: the policy picks the stable among 1 and 2
        ("{latest: 1}", "2", ["2", "3"]),  # a canary of an older version: it loads next to the newest
        ("all", "3", ["1", "2", "3"]),
        ("{specific: [1]}", "3", ["1", "3"]),
        ("{specific: [3]}", "3", ["3"]),  # the policy keeps no other version: nothing to compare with
        ("{latest: 1}", "7", ["3"]),  # no such version: nothing held
    ],
)
def test_a_held_version_loads_besides_what_the_policy_chooses(tmp_path, policy, held, loaded):
    from edgeinfer.repository.sources import scan_model_dir

    for version in (1, 2, 3):
        matmul_model(tmp_path / "m" / str(version) / "model.onnx")
    (tmp_path / "m" / "config.yaml").write_text(f"version_policy: {policy}\n")
    sources = scan_model_dir(tmp_path / "m", tmp_path, held=held)
    assert [source.version for source in sources] == loaded


def test_a_bad_version_policy_says_how_to_write_it(tmp_path, model_file):
    path = write(tmp_path, "models:\n  m:\n    model_path: m.onnx\n    version_policy: newest\n")
    with pytest.raises(ConfigError, match=r"write version_policy as \{latest: N\}, all, or \{specific"):
        load_config(path)


def test_warmup_and_polling_keys(tmp_path, model_file):
    path = write(
        tmp_path,
        "repository: {poll_interval_s: 5}\n"
        "models:\n  m:\n    model_path: m.onnx\n"
        "    warmup: {batch_sizes: [1, 2], shapes: {X: [16]}, samples: [a.json]}\n",
    )
    config = load_config(path)
    assert config.repository.poll_interval_s == 5
    assert config.models["m"].warmup.shapes == {"X": (16,)}


def test_tls_client_auth_needs_a_ca():
    with pytest.raises(ConfigError, match="client_auth: require needs ca_file"):
        parse(Config, {"server": {"tls": {"cert_file": "c", "key_file": "k", "client_auth": "require"}}}, "x")


def test_tls_and_key_files_are_relative_to_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    config_file = tmp_path / "sub" / "config.yaml"
    config_file.write_text(
        "server: {tls: {cert_file: c.pem, key_file: k.pem}, auth: {keys_file: keys.yaml}}\n"
    )
    server = load_config(config_file).server
    assert server.tls is not None
    assert server.tls.cert_file == str(tmp_path / "sub" / "c.pem")
    assert server.auth.keys_file == str(tmp_path / "sub" / "keys.yaml")


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000\n", None),  # no quota: the affinity mask
        ("100000 100000\n", 1),
        ("150000 100000\n", 2),  # 1.5 CPUs of quota: two processes can use it
        ("50000 100000\n", 1),  # at least one
        (None, None),  # no cgroup v2 file (not in a container, or cgroup v1)
    ],
)
def test_workers_auto_follows_the_cpu_quota(tmp_path, cpu_max, expected):
    """docs/deployment.md: ``workers: auto`` is one worker per CPU this process may use, a container's CPU
    quota included (cgroup v2's cpu.max), never more than its affinity mask."""
    if cpu_max is not None:
        (tmp_path / "cpu.max").write_text(cpu_max)
    mask = len(os.sched_getaffinity(0))
    assert available_cpus(tmp_path) == (mask if expected is None else min(expected, mask))


@pytest.mark.parametrize("workers", ["auto", 0])
def test_workers_auto_is_the_cpus_available(monkeypatch: pytest.MonkeyPatch, workers):
    monkeypatch.setattr(config_module, "available_cpus", lambda: 7)
    assert parse(Config, {"server": {"workers": workers}}, "x").server.worker_count == 7


def test_an_old_unit_spelling_still_works_with_a_deprecation_line(tmp_path: Path, caplog):
    matmul_model(tmp_path / "m.onnx")
    path = tmp_path / "config.yaml"
    path.write_text("models:\n  m: {model_path: m.onnx, batch_timeout_millis: 4, queue_timeout_millis: 50}\n")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.model_config"):
        model = load_config(path).models["m"]
    assert (model.batch_timeout_ms, model.queue_timeout_ms) == (4, 50)
    said = " ".join(record.getMessage() for record in caplog.records)
    assert "batch_timeout_millis is deprecated: it is now batch_timeout_ms" in said
    path.write_text("models:\n  m: {model_path: m.onnx, queue_timeout_millis: 5, queue_timeout_ms: 5}\n")
    with pytest.raises(ConfigError, match="give only one of queue_timeout_millis, queue_timeout_ms"):
        load_config(path)
