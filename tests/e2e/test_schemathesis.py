"""schemathesis against `openapi.yaml` with every check, on the real gateway in front of the test
upstream: no 5xx, every answer conforms, schema-valid requests are accepted and invalid ones refused.

The admin routes run on a gateway of their own (workers confined to loopback): the stateful phase
adds and removes workers, which would otherwise leave the OpenAI routes without one (a 503, rightly).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.settings import ApiKeySettings, AuthSettings
from tests.e2e.conftest import gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "sk-schemathesis"
SCHEMATHESIS = Path(sys.executable).with_name("st")
SCOPES = {"openai": ["--exclude-path-regex", "^/admin"], "admin": ["--include-path-regex", "^/admin"]}


@pytest.mark.parametrize("scope", list(SCOPES))
def test_every_operation_conforms_to_openapi_yaml(scope: str, upstream_server: UpstreamServer) -> None:
    auth = AuthSettings(api_keys=[ApiKeySettings(tenant="ops", sha256=hash_key(ADMIN_KEY), admin=True)])
    gateway = GatewayServer(create_app(gateway_settings(upstream_server.url, auth=auth))).start()
    try:
        command = [str(SCHEMATHESIS), "run", str(ROOT / "openapi.yaml"), "--url", gateway.base_url]
        command += ["--checks", "all", "--max-examples", "30", "--seed", "2", "--request-timeout", "5"]
        command += ["--header", f"Authorization: Bearer {ADMIN_KEY}", *SCOPES[scope]]
        run = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    finally:
        gateway.stop()
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failures" not in run.stdout.splitlines()[-1]
