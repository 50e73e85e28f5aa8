"""The one mapping of the pipeline's errors to gRPC status codes (`proxy.grpc.status`)."""

from __future__ import annotations

import grpc
import pytest

from adapters.errors import EngineOverloaded, UpstreamTimeout
from proxy.errors import ApiError
from proxy.grpc.status import grpc_code, grpc_error

Code = grpc.StatusCode


@pytest.mark.parametrize(
    ("http_status", "code"),
    [
        (400, Code.INVALID_ARGUMENT),
        (401, Code.UNAUTHENTICATED),
        (403, Code.PERMISSION_DENIED),
        (404, Code.NOT_FOUND),
        (429, Code.RESOURCE_EXHAUSTED),
        (502, Code.UNAVAILABLE),
        (503, Code.UNAVAILABLE),
        (504, Code.DEADLINE_EXCEEDED),
        (405, Code.INTERNAL),
        (500, Code.INTERNAL),
    ],
)
def test_http_status_to_grpc_code(http_status: int, code: grpc.StatusCode) -> None:
    assert grpc_code(http_status) is code


def test_an_api_error_keeps_its_message_and_names_its_param() -> None:
    error = grpc_error(ApiError(400, "Invalid request: Expected `int`", param="max_tokens"))
    assert error == (Code.INVALID_ARGUMENT, "Invalid request: Expected `int` (`max_tokens`)", 400)
    assert grpc_error(ApiError.model_not_found("m")).message.count("`m`") == 1  # named once


def test_engine_errors_and_the_unexpected() -> None:
    assert grpc_error(UpstreamTimeout("upstream timed out")).code is Code.DEADLINE_EXCEEDED
    assert grpc_error(EngineOverloaded("no healthy worker")).code is Code.UNAVAILABLE
    unexpected = grpc_error(RuntimeError("boom"))
    assert unexpected.code is Code.INTERNAL
    assert "boom" not in unexpected.message  # internals stay in the log
