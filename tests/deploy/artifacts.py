"""The shipped deploy artifacts as data: alert rules, dashboards, the PromQL they hold, and the tools."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts_test.yaml"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
OPERATIONS_DOC = REPO / "docs" / "operations.md"

_METRIC = re.compile(r"\b(radixgate_[a-z0-9_]+)")
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself; the rules may name them, the gateway never exports them."""

GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}
"""What Grafana puts in place of the dashboards' variables, so that promtool can parse the queries."""


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def dashboard_exprs(path: Path) -> list[str]:
    board = dashboard(path)
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    exprs += [
        variable["definition"].removeprefix("label_values(").split(",")[0]
        for variable in board["templating"]["list"]
        if variable["type"] == "query"
    ]
    return exprs


def grafana_substituted(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The radixgate series an expression reads (histogram ones with their `_bucket` suffix)."""
    return set(_METRIC.findall(expr))


def every_named_metric() -> dict[str, set[str]]:
    """Metric name -> the artifacts that use it."""
    users: dict[str, set[str]] = {}
    for rule in alert_rules():
        for name in metric_names(rule["expr"]):
            users.setdefault(name, set()).add(f"alert {rule['alert']}")
    for path in DASHBOARDS:
        for expr in dashboard_exprs(path):
            for name in metric_names(expr):
                users.setdefault(name, set()).add(f"dashboard {path.name}")
    return users


def tool(name: str) -> str:
    """The path of a command-line tool, or skip the test (`.ci/run` installs them)."""
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"`{name}` is not installed (`.ci/run` installs it)")
    return found
