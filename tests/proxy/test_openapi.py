"""openapi.yaml at the repository root matches the code, and lists exactly what the app serves."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from litestar.testing import TestClient

from proxy.app import create_app
from proxy.openapi_export import build_openapi
from proxy.routing.config import WorkerSpec
from proxy.settings import Settings

OPENAPI_FILE = Path(__file__).parents[2] / "openapi.yaml"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PATH_PARAMETER = re.compile(r"\{(\w+):\w+\}")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(Settings(workers=[WorkerSpec(url="http://127.0.0.1:9", models=["m"])]))
    with TestClient(app) as client:
        yield client


def test_file_is_what_make_openapi_writes() -> None:
    assert yaml.safe_load(OPENAPI_FILE.read_text()) == build_openapi(), (
        "openapi.yaml is stale: run `make openapi`"
    )


def _served(client: TestClient, method: str, path: str) -> bool:
    """Whether a route answers `method` on `path`: anything but 405 or the unknown-URL 404."""
    response = client.request(method, PATH_PARAMETER.sub("probe", path), content=b"{}")
    if response.status_code == 404:
        return bool(response.json()["error"]["code"] != "unknown_url")
    return response.status_code != 405


def test_documented_routes_are_exactly_the_served_ones(client: TestClient) -> None:
    paths = {route.path for route in client.app.routes}
    served = {
        (PATH_PARAMETER.sub(r"{\1}", path), method)
        for path in paths
        for method in METHODS
        if _served(client, method, path)
    }
    documented = {
        (path, method.upper()) for path, item in build_openapi()["paths"].items() for method in item
    }
    assert served == documented
