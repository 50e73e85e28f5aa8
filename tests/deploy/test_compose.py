"""deploy/compose.yaml parses, and agrees with the gateway's settings, the image and the other files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from proxy.config import load_settings
from proxy.routes.health import LIVE_PATH
from tests.deploy.artifacts import DEPLOY, RULES, tool

COMPOSE = DEPLOY / "compose.yaml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
GATEWAYS = ("gateway", "gateway-gpu")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _environment(service: dict[str, Any]) -> dict[str, str]:
    return {name: str(value) for name, value in service["environment"].items()}


def _container_ports(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> published host port."""
    return {int(p.split(":")[1]): int(p.split(":")[0]) for p in service.get("ports", [])}


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path of each bind mount."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            found[target] = (COMPOSE.parent / source).resolve()
    return found


@pytest.mark.parametrize("name", GATEWAYS)
def test_gateway_environment_is_valid_settings_and_listens_where_published(
    compose: dict[str, Any], name: str
) -> None:
    service = compose["services"][name]
    environ = _environment(service)
    settings = load_settings(environ=environ)  # a misspelled RADIXGATE_* key is a SettingsError
    assert settings.server.host == "0.0.0.0"
    assert settings.server.port in _container_ports(service)
    assert settings.cache.redis_url is not None
    assert urlsplit(settings.cache.redis_url).hostname in compose["services"]
    assert str(settings.cache.dir).startswith("/var/cache/radixgate")
    assert service["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]).is_file()


def test_the_gateway_volume_is_the_directory_the_image_prepares(compose: dict[str, Any]) -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "RADIXGATE_CACHE_DIR=/var/cache/radixgate" in dockerfile
    assert "gateway-cache:/var/cache/radixgate" in compose["services"]["gateway"]["volumes"]


def test_the_healthcheck_probes_the_liveness_path_on_the_listening_port(compose: dict[str, Any]) -> None:
    service = compose["services"]["gateway"]
    port = load_settings(environ=_environment(service)).server.port
    assert f"http://127.0.0.1:{port}{LIVE_PATH}" in " ".join(service["healthcheck"]["test"])


def test_the_gpu_profile_routes_over_both_engines(compose: dict[str, Any]) -> None:
    services = compose["services"]
    settings = load_settings(environ=_environment(services["gateway-gpu"]))
    targets = {(w.kind, urlsplit(w.url).hostname, urlsplit(w.url).port) for w in settings.workers}
    assert {kind for kind, _, _ in targets} == {"vllm", "sglang"}
    for kind, host, port in targets:
        assert host == kind and services[kind]["profiles"] == ["gpu"]
        assert port in _container_ports(services[kind])
    assert "profiles" not in services["gateway"]  # the default stack runs the embedded engine
    assert load_settings(environ=_environment(services["gateway"])).workers == []


def test_traces_go_to_the_trace_ui_over_a_port_it_opens(compose: dict[str, Any]) -> None:
    environ = _environment(compose["services"]["gateway"])
    endpoint = urlsplit(environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname == "phoenix"
    assert endpoint.port in _container_ports(compose["services"]["phoenix"])
    assert environ["OTEL_EXPORTER_OTLP_PROTOCOL"] in {"grpc", "http/protobuf"}


def test_prometheus_scrapes_the_gateways_and_loads_the_shipped_rules(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    mounts = _mounts(compose["services"]["prometheus"])
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert mounts["/etc/prometheus/prometheus.yml"] == PROMETHEUS_CONFIG
    assert [mounts[path] for path in config["rule_files"]] == [RULES]
    (job,) = config["scrape_configs"]
    discovery = job["dns_sd_configs"][0]
    assert set(discovery["names"]) == set(GATEWAYS)
    for name in GATEWAYS:
        port = load_settings(environ=_environment(compose["services"][name])).server.port
        assert discovery["port"] == port
    # promtool checks the config with the rule files where the container has them.
    config["rule_files"] = [str(RULES)]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [tool("promtool"), "check", "config", str(local)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_is_provisioned_with_the_datasource_and_every_dashboard(compose: dict[str, Any]) -> None:
    mounts = _mounts(compose["services"]["grafana"])
    datasources = mounts["/etc/grafana/provisioning/datasources"]
    (source,) = yaml.safe_load((datasources / "prometheus.yaml").read_text())["datasources"]
    prometheus_port = next(iter(_container_ports(compose["services"]["prometheus"])))
    assert source["url"] == f"http://prometheus:{prometheus_port}"
    provider_dir = mounts["/etc/grafana/provisioning/dashboards"]
    (provider,) = yaml.safe_load((provider_dir / "radixgate.yaml").read_text())["providers"]
    dashboards = mounts[provider["options"]["path"]]
    assert sorted(p.name for p in dashboards.glob("*.json")) == [
        "radixgate-overview.json",
        "radixgate-routing.json",
    ]
    for path in dashboards.glob("*.json"):
        uids = {t["datasource"]["uid"] for p in json.loads(path.read_text())["panels"] for t in p["targets"]}
        assert uids == {"${datasource}"}
    home = _environment(compose["services"]["grafana"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).name in {p.name for p in dashboards.glob("*.json")}


def test_docker_compose_validates_the_file(compose: dict[str, Any]) -> None:
    """docker-compose's own schema check (Debian's docker-compose; `.ci/run` installs it)."""
    result = subprocess.run(
        [tool("docker-compose"), "-f", str(COMPOSE), "--profile", "gpu", "config", "--services"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == set(compose["services"])
