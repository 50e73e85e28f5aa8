"""A real Prometheus (Debian's `prometheus` binary) scrapes a real gateway routing over real worker
processes, loads the shipped rules and evaluates them without error; killing a worker fires
RadixgateWorkerDown, stopping the gateway fires RadixgateScrapeFailing.

The rules are the shipped ones with every `for:` cut to 0s and a 1 s evaluation interval, so the
test waits seconds rather than minutes; the expressions are untouched.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from proxy.routing.launch import free_port
from tests.deploy.artifacts import RULES, alert_rules, tool
from tests.e2e.routing_support import MODEL, SimWorker, start_gateway, start_workers, stop_all
from tests.gateway_server import GatewayServer


class Prometheus:
    """One `prometheus` process on a loopback port, with a throwaway data directory."""

    def __init__(self, binary: str, directory: Path, target: str) -> None:
        rules = yaml.safe_load(RULES.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule["for"] = "0s"
        (directory / "alerts.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(directory / "alerts.yaml")],
            "scrape_configs": [{"job_name": "radixgate", "static_configs": [{"targets": [target]}]}],
        }
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def api(self, path: str) -> Any:
        body = httpx.get(f"{self.url}/api/v1/{path}", timeout=5).json()
        assert body["status"] == "success", body
        return body["data"]

    def firing(self) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["state"] == "firing"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Prometheus, GatewayServer, list[SimWorker]]]:
    binary = tool("prometheus")
    workers = start_workers(2)
    gateway = start_gateway(workers)
    prometheus = Prometheus(binary, tmp_path, f"127.0.0.1:{gateway.port}")
    try:
        wait_until(lambda: httpx.get(f"{prometheus.url}/-/ready", timeout=1).status_code == 200, "ready")
        yield prometheus, gateway, workers
    finally:
        prometheus.stop()
        gateway.stop()
        stop_all(workers)


def _target_up(prometheus: Prometheus) -> bool:
    targets = prometheus.api("targets")["activeTargets"]
    return bool(targets) and targets[0]["health"] == "up"


def _alerts_named(prometheus: Prometheus, name: str) -> list[dict[str, str]]:
    return [alert["labels"] for alert in prometheus.firing() if alert["labels"]["alertname"] == name]


def test_rules_evaluate_cleanly_and_a_killed_worker_fires_worker_down(
    stack: tuple[Prometheus, GatewayServer, list[SimWorker]],
) -> None:
    prometheus, gateway, workers = stack
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=30) as sdk:
        for i in range(4):
            sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=4
            )

    wait_until(lambda: _target_up(prometheus), "the gateway to be scraped")

    def every_rule_evaluated() -> bool:
        rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
        return len(rules) == len(alert_rules()) and all(
            rule["health"] == "ok" and rule.get("lastEvaluation", "").startswith("20") for rule in rules
        )

    wait_until(every_rule_evaluated, "every rule to be evaluated")
    rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
    assert [rule.get("lastError", "") for rule in rules] == [""] * len(rules)
    assert prometheus.firing() == []  # a healthy stack raises nothing

    workers[0].kill()
    wait_until(lambda: bool(_alerts_named(prometheus, "RadixgateWorkerDown")), "RadixgateWorkerDown")
    (down,) = _alerts_named(prometheus, "RadixgateWorkerDown")
    assert (down["worker"], down["severity"]) == ("w0", "warning")
    assert _alerts_named(prometheus, "RadixgateNoHealthyWorker") == []  # w1 still serves the model

    workers[1].kill()
    wait_until(lambda: bool(_alerts_named(prometheus, "RadixgateNoHealthyWorker")), "NoHealthyWorker")
    assert _alerts_named(prometheus, "RadixgateNoHealthyWorker")[0]["model"] == MODEL


def test_a_stopped_gateway_fires_scrape_failing(
    stack: tuple[Prometheus, GatewayServer, list[SimWorker]],
) -> None:
    prometheus, gateway, _ = stack
    wait_until(lambda: _target_up(prometheus), "a first scrape")
    gateway.stop()
    wait_until(lambda: bool(_alerts_named(prometheus, "RadixgateScrapeFailing")), "RadixgateScrapeFailing")
