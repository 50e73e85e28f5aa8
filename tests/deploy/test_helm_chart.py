"""deploy/helm/radixgate renders, with the real `helm`, to manifests that the Kubernetes API schemas
accept (kubernetes-validate, strict: no unknown fields) and that the gateway's settings loader accepts."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.auth import hash_key
from proxy.config import load_settings
from proxy.routes.health import LIVE_PATH, READY_PATH
from tests.deploy.artifacts import DEPLOY, tool

CHART = DEPLOY / "helm" / "radixgate"
KUBERNETES_VERSION = "1.30.0"
"""The oldest Kubernetes minor still supported upstream that the chart is checked against."""
CRDS = {"ServiceMonitor"}
"""Kinds from the Prometheus Operator's CRDs, which no Kubernetes schema covers (checked by hand)."""

EVERYTHING_ON = [
    "--set", "redis.enabled=true",
    "--set", "autoscaling.enabled=true",
    "--set", "serviceMonitor.enabled=true",
    "--set", "workers[0].url=http://vllm.inference:8000",
    "--set", "workers[0].kind=vllm",
    "--set", "workers[0].models[0]=meta-llama/Llama-3.1-8B-Instruct",
    "--set", "workers[1].url=http://sglang.inference:30000",
    "--set", "workers[1].kind=sglang",
    "--set", "apiKeys[0].tenant=acme",
    "--set", f"apiKeys[0].sha256={hash_key('sk-acme')}",
    "--set", "cacheSaltSecret=s3cret",
]  # fmt: skip


def render(*args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [tool("helm"), "template", "rg", str(CHART), *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def test_helm_lint_passes() -> None:
    result = subprocess.run([tool("helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", [[], EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_every_manifest_is_valid_against_the_kubernetes_schemas(values: list[str]) -> None:
    manifests = render(*values)
    for manifest in manifests:
        if manifest["kind"] in CRDS:
            continue
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_defaults_render_the_core_objects_only() -> None:
    kinds = sorted(kind for kind, _ in by_kind(render()))
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"]


def test_everything_on_adds_the_hpa_servicemonitor_and_redis() -> None:
    objects = by_kind(render(*EVERYTHING_ON))
    assert ("HorizontalPodAutoscaler", "rg-radixgate") in objects
    assert ("Deployment", "rg-redis") in objects and ("Service", "rg-redis") in objects
    monitor = objects[("ServiceMonitor", "rg-radixgate")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    service = objects[("Service", "rg-radixgate")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "replicas" not in objects[("Deployment", "rg-radixgate")]["spec"]  # the HPA owns it


def test_the_pod_is_locked_down_and_probed_on_the_health_paths() -> None:
    deployment = by_kind(render())[("Deployment", "rg-radixgate")]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The user deploy/Dockerfile creates and switches to: the image's files are its own.
    assert f"--uid {pod['securityContext']['runAsUser']} radixgate" in (DEPLOY / "Dockerfile").read_text()
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == LIVE_PATH
    assert container["readinessProbe"]["httpGet"]["path"] == READY_PATH
    assert container["resources"]["requests"] and container["resources"]["limits"]


def _gateway_view(
    objects: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> tuple[Path, dict[str, str]]:
    """The config file and environment the gateway container would see."""
    deployment = objects[("Deployment", "rg-radixgate")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    config_name = deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    config = tmp_path / "radixgate.toml"
    config.write_text(objects[("ConfigMap", config_name)]["data"]["radixgate.toml"])
    environ: dict[str, str] = {}
    for variable in container["env"]:
        if "value" in variable:
            environ[variable["name"]] = variable["value"]
        else:
            ref = variable["valueFrom"]["secretKeyRef"]
            secret = objects[("Secret", ref["name"])]
            data = secret.get("stringData") or {
                k: base64.b64decode(v).decode() for k, v in secret["data"].items()
            }
            environ[variable["name"]] = data[ref["key"]]
    assert container["args"] == ["serve", "--config", "/etc/radixgate/radixgate.toml"]
    return config, environ


@pytest.mark.parametrize("values", [[], EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_the_rendered_config_and_environment_load_as_settings(values: list[str], tmp_path: Path) -> None:
    objects = by_kind(render(*values))
    config, environ = _gateway_view(objects, tmp_path)
    settings = load_settings(str(config), environ=environ)
    deployment = objects[("Deployment", "rg-radixgate")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["ports"][0]["containerPort"] == settings.server.port
    assert settings.server.host == "0.0.0.0"
    if values:
        assert [(w.url, w.kind) for w in settings.workers] == [
            ("http://vllm.inference:8000", "vllm"),
            ("http://sglang.inference:30000", "sglang"),
        ]
        assert [(k.tenant, k.sha256) for k in settings.auth.api_keys] == [("acme", hash_key("sk-acme"))]
        assert settings.cache.redis_url == "redis://rg-redis:6379/0"
        redis_service = objects[("Service", "rg-redis")]
        assert redis_service["spec"]["ports"][0]["port"] == 6379
    else:
        assert settings.workers == [] and settings.auth.api_keys == []
        assert settings.cache.redis_url is None


def test_a_changed_config_rolls_the_pods() -> None:
    def checksum(*values: str) -> str:
        deployment = by_kind(render(*values))[("Deployment", "rg-radixgate")]
        annotations: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return json.dumps(annotations, sort_keys=True)

    assert checksum() == checksum()
    assert checksum() != checksum("--set", 'config=[server]\nlog_level = "debug"\n')
