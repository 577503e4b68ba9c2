"""The pure parts of tracing: exporters, protocol and sampler from the standard OTEL_* variables, the
resource, and nothing imported while tracing is off."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from edgeinfer.app import start_tracing
from edgeinfer.config import Config, TracingConfig
from edgeinfer.config_file import parse
from edgeinfer.errors import ConfigError
from edgeinfer.tracing import Sampling, _resource, exporters_from_environment, sampling_from_environment

OTEL_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, [HttpExporter]),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "console"}, [ConsoleSpanExporter]),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, [HttpExporter, ConsoleSpanExporter]),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, [GrpcExporter]),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
            [HttpExporter],
        ),
    ],
)
def test_exporters_come_from_the_standard_variables(monkeypatch, environment, expected):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert [type(exporter) for exporter in exporters_from_environment()] == expected


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "jaeger"},
            "OTEL_TRACES_EXPORTER names 'jaeger'; edgeinfer exports traces to otlp, console or none",
        ),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTLP protocol 'http/json' (OTEL_EXPORTER_OTLP_PROTOCOL): edgeinfer exports traces over "
            "http/protobuf or grpc",
        ),
    ],
)
def test_an_exporter_edgeinfer_does_not_have_is_a_config_error_naming_it(monkeypatch, environment, message):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        exporters_from_environment()
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, Sampling(0.25, follow_parent=True)),  # the config's ratio, parent-based
        ({"OTEL_TRACES_SAMPLER": "always_on"}, Sampling(1.0, follow_parent=False)),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, Sampling(0.0, follow_parent=False)),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, Sampling(0.0, follow_parent=True)),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}, Sampling(0.5, False)),
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}, Sampling(1.0, follow_parent=True)),
        (
            {"OTEL_TRACES_SAMPLER": " ParentBased_TraceIdRatio ", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
            Sampling(0.01),
        ),
    ],
)
def test_sampling_is_the_configs_ratio_unless_the_standard_variable_names_a_sampler(
    monkeypatch, environment, expected
):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert sampling_from_environment(TracingConfig(enabled=True, sampling_ratio=0.25)) == expected


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        (
            {"OTEL_TRACES_SAMPLER": "jaeger_remote"},
            "OTEL_TRACES_SAMPLER names 'jaeger_remote'; edgeinfer samples",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            "OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1, not '1.5'",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1, not 'half'",
        ),
    ],
)
def test_a_sampler_edgeinfer_does_not_have_is_a_config_error(monkeypatch, environment, message):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        sampling_from_environment(TracingConfig(enabled=True))


def test_a_ratio_records_about_that_share_of_new_traces():
    assert all(Sampling(1.0).draw() for _ in range(1000))
    assert not any(Sampling(0.0).draw() for _ in range(1000))
    drawn = sum(Sampling(0.5).draw() for _ in range(4000))
    assert 1700 < drawn < 2300, drawn  # 2000 +- 300: more than 9 standard deviations


def test_the_service_is_named_edgeinfer_unless_the_environment_names_it(monkeypatch):
    assert _resource().attributes["service.name"] == "edgeinfer"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-7")
    assert _resource().attributes["service.name"] == "gateway-7"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=line-3,site=plant")
    attributes = _resource().attributes
    assert (attributes["service.name"], attributes["site"]) == ("line-3", "plant")


def test_tracing_config_is_checked():
    assert parse(Config, {"tracing": {"enabled": True, "sampling_ratio": "0.25"}}, "config").tracing == (
        TracingConfig(enabled=True, sampling_ratio=0.25)
    )
    with pytest.raises(
        ConfigError, match=r"tracing\.sampling_ratio: Input should be less than or equal to 1"
    ):
        parse(Config, {"tracing": {"sampling_ratio": 2}}, "config")
    with pytest.raises(ConfigError, match=r"tracing\.sample_rate: unknown key"):
        parse(Config, {"tracing": {"sample_rate": 0.5}}, "config")


def test_tracing_off_or_disabled_by_the_sdk_variable_builds_nothing(monkeypatch):
    assert start_tracing(TracingConfig()) is None
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert start_tracing(TracingConfig(enabled=True)) is None


def test_a_server_without_tracing_never_imports_opentelemetry():
    script = (
        "import sys, asyncio\n"
        "from edgeinfer.config import Config\n"
        "from edgeinfer.app import Server\n"
        "server = Server(Config.model_validate({'server': {'http_port': 0, 'grpc_port': 0}}))\n"
        "async def main():\n"
        "    await server.start()\n"
        "    await server.stop()\n"
        "asyncio.run(main())\n"
        "print(sorted(name for name in sys.modules if name.startswith('opentelemetry')))\n"
    )
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]"
