"""The shipped alert rules, checked with Prometheus' own `promtool`, and documented in operations.md."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.artifacts import (
    DASHBOARDS,
    OPERATIONS_DOC,
    RULE_TESTS,
    RULES,
    alert_rules,
    dashboard_exprs,
    grafana_substituted,
    tool,
)

EXPECTED_ALERTS = {
    "RadixgateScrapeFailing",
    "RadixgateWorkerDown",
    "RadixgateNoHealthyWorker",
    "RadixgateBreakerOpen",
    "RadixgateHigh5xxRatio",
    "RadixgateTimeToFirstTokenSLO",
    "RadixgateResponseCacheHitRateCollapse",
    "RadixgateDiskTierNearCapacity",
    "RadixgateCacheTierErrors",
}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_every_alert_fires_on_its_failure_and_stays_quiet_when_healthy() -> None:
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == EXPECTED_ALERTS


def test_each_alert_has_a_summary_a_severity_and_a_runbook_section() -> None:
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} == EXPECTED_ALERTS
    doc = OPERATIONS_DOC.read_text()
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]
        anchor = rule["annotations"]["runbook_url"].split("#")[1]
        assert anchor == rule["alert"].lower()
        assert f"### {rule['alert']}\n" in doc, f"docs/operations.md has no runbook for {rule['alert']}"


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool parses each panel's query (Grafana's variables filled in) as a recording rule."""
    rules = [
        {"record": f"dashboard:{path.stem.replace('-', '_')}:{i}", "expr": grafana_substituted(expr)}
        for path in DASHBOARDS
        for i, expr in enumerate(dashboard_exprs(path))
    ]
    rules_file = tmp_path / "dashboards.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = _promtool("check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr
