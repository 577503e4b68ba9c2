"""The Kubernetes and KServe manifests in deploy/, validated offline.

Both Kustomize overlays are rendered with ``kubectl kustomize``; core kinds are validated with
kubernetes-validate in strict mode against a pinned Kubernetes version; kinds defined by CRDs against the
CRDs' vendored OpenAPI schemas (tests/data/crds) with unknown fields rejected; and every metric name the
autoscaler and the adapter rules use is checked against a live ``/metrics``.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support import ROOT, ServerProcess, infer_body, request, scrape

KUBERNETES_VERSION = "1.33.0"  # a current release that edge distributions (k3s, MicroK8s) ship
DEPLOY = ROOT / "deploy"
CRDS = ROOT / "tests" / "data" / "crds"
OVERLAYS = ("edge", "cloud")


def _render(overlay: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [document for document in yaml.safe_load_all(result.stdout) if document]


@cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    if shutil.which("kubectl") is None:
        pytest.skip(
            "kubectl is not installed (make system-packages installs it): the overlays cannot be rendered"
        )
    return tuple(_render(overlay))


def _of_kind(documents: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [document for document in documents if document["kind"] == kind]


def _closed(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever the CRD lists an object's fields."""
    if isinstance(schema, dict):
        closed = {key: _closed(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            closed["additionalProperties"] = False
        return closed
    if isinstance(schema, list):
        return [_closed(value) for value in schema]
    return schema


@cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    group, version = api_version.split("/")
    path = CRDS / f"{group}_{kind}_{version}.json.gz"
    with gzip.open(path, "rt") as schema_file:
        schema = _closed(json.load(schema_file))
    # metadata is the API server's ObjectMeta, which the CRD leaves open: check what we use is a mapping
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def validate(document: dict[str, Any]) -> None:
    """Raise if ``document`` is not a valid object of its kind (core kinds or our vendored CRDs)."""
    api_version, kind = document["apiVersion"], document["kind"]
    group = api_version.split("/")[0] if "/" in api_version else ""
    if group.endswith(("kserve.io", "coreos.com")):
        errors = sorted(_crd_validator(api_version, kind).iter_errors(document), key=str)
        if errors:
            where = "/".join(str(part) for part in errors[0].absolute_path)
            raise jsonschema.ValidationError(f"{kind} at {where}: {errors[0].message}")
        return
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_is_valid(overlay):
    documents = rendered(overlay)
    kinds = sorted(document["kind"] for document in documents)
    expected = ["ConfigMap", "Deployment", "Namespace", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    if overlay == "cloud":
        expected.append("HorizontalPodAutoscaler")
    assert kinds == sorted(expected)
    for document in documents:
        validate(document)


@pytest.mark.parametrize(
    "path", ["kserve/servingruntime.yaml", "kserve/inferenceservice.yaml"], ids=["runtime", "isvc"]
)
def test_kserve_manifests_are_valid(path):
    (document,) = yaml.safe_load_all((DEPLOY / path).read_text())
    validate(document)


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        (
            "Deployment",
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolcy="Always"),
        ),
        ("Deployment", lambda d: d["spec"].update(replicas="two")),
        ("Service", lambda d: d["spec"]["ports"][0].update(port="eighty")),
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(intervall="15s")),
        ("ServiceMonitor", lambda d: d["spec"].update(selector="edgeinfer")),
    ],
    ids=["misspelt-container-field", "replicas-string", "port-type", "misspelt-crd-field", "crd-type"],
)
def test_the_validation_rejects_what_the_api_server_would(kind, change):
    """The checks above can fail: a misspelt field or a wrong type in each kind of object is caught."""
    document = copy.deepcopy(_of_kind(rendered("cloud"), kind)[0])
    change(document)
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(document)


def test_kserve_runtime_rejects_a_misspelt_field():
    (document,) = yaml.safe_load_all((DEPLOY / "kserve" / "servingruntime.yaml").read_text())
    document["spec"]["protocolVersion"] = ["v2"]  # the field is protocolVersions
    with pytest.raises(jsonschema.ValidationError, match="protocolVersion"):
        validate(document)


def test_edge_and_cloud_differ_as_documented():
    edge, cloud = rendered("edge"), rendered("cloud")
    (edge_deployment,) = _of_kind(edge, "Deployment")
    (cloud_deployment,) = _of_kind(cloud, "Deployment")
    assert edge_deployment["spec"]["replicas"] == 1
    edge_volumes = {
        volume["name"]: volume for volume in edge_deployment["spec"]["template"]["spec"]["volumes"]
    }
    assert edge_volumes["models"] == {
        "name": "models",
        "hostPath": {"path": "/var/lib/edgeinfer/models", "type": "Directory"},
    }
    (hpa,) = _of_kind(cloud, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    (container,) = cloud_deployment["spec"]["template"]["spec"]["containers"]
    assert container["envFrom"] == [{"secretRef": {"name": "edgeinfer-s3"}}]
    (config_map,) = _of_kind(cloud, "ConfigMap")
    assert yaml.safe_load(config_map["data"]["config.yaml"])["model_store_path"].startswith("s3://")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_is_hardened_and_probes_use_the_v2_health_routes(overlay):
    (deployment,) = _of_kind(rendered(overlay), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert {port["name"]: port["containerPort"] for port in container["ports"]} == {
        "http": 8080, "grpc": 8081, "metrics": 8082,
    }  # fmt: skip
    # the drain fits the grace period: the config's delay, the server's 10 s drain, the hook's SIGTERM
    (config_map,) = _of_kind(rendered(overlay), "ConfigMap")
    delay = yaml.safe_load(config_map["data"]["config.yaml"])["server"]["shutdown_delay_s"]
    assert delay + 10 < pod["terminationGracePeriodSeconds"]
    assert "os.kill(1, signal.SIGTERM)" in " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    (service,) = _of_kind(rendered(overlay), "Service")
    assert {port["name"] for port in service["spec"]["ports"]} == {"http", "grpc", "metrics"}
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def _adapter_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load((DEPLOY / "k8s" / "prometheus-adapter" / "rules.yaml").read_text())["rules"]
    values = yaml.safe_load((DEPLOY / "k8s" / "prometheus-adapter" / "values.yaml").read_text())
    assert values["rules"]["custom"] == rules, "values.yaml and rules.yaml must hold the same rules"
    return rules


def test_metrics_the_autoscaler_and_adapter_use_exist_in_a_live_scrape(example_server: ServerProcess):
    assert request(example_server.port, "POST", "/v2/models/simple/infer", infer_body({})).status in (
        200,
        400,
    )
    live = set(scrape(example_server.port))
    used = set()
    for rule in _adapter_rules():
        series = rule["seriesQuery"].split("{")[0]
        used.add(series)
        assert rule["name"]["as"] == series
    (hpa,) = _of_kind(rendered("cloud"), "HorizontalPodAutoscaler")
    hpa_metrics = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert hpa_metrics <= used, "the autoscaler asks for a metric no adapter rule serves"
    assert used <= live, f"not in /metrics: {sorted(used - live)}"


def test_crd_schemas_are_vendored_with_their_source():
    readme = (CRDS / "README.md").read_text()
    for path in CRDS.glob("*.json.gz"):
        assert path.name in readme
    assert Path(CRDS / "serving.kserve.io_InferenceService_v1beta1.json.gz").stat().st_size > 1000


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_verifies(tmp_path):
    """The shipped unit, pointed at this environment's edgeinfer, passes ``systemd-analyze verify``."""
    unit = (DEPLOY / "systemd" / "edgeinfer.service").read_text()
    executable = Path(sys.executable).parent / "edgeinfer"
    assert unit.count("/opt/edgeinfer/bin/edgeinfer serve") == 1
    (tmp_path / "edgeinfer.service").write_text(unit.replace("/opt/edgeinfer/bin/edgeinfer", str(executable)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "edgeinfer.service")],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    assert result.returncode == 0, result.stderr
    assert "edgeinfer.service" not in result.stderr, result.stderr
