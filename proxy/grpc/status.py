"""The gRPC status of an error the pipeline raised, from the HTTP status that `error_reply` gives it."""

from __future__ import annotations

from typing import NamedTuple

import grpc

from proxy.errors import error_reply

_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


class GrpcError(NamedTuple):
    """What a gRPC call answers for an exception."""

    code: grpc.StatusCode
    message: str
    http_status: int


def grpc_code(http_status: int) -> grpc.StatusCode:
    """The gRPC status code that means what `http_status` means; INTERNAL for any other status."""
    return _CODES.get(http_status, grpc.StatusCode.INTERNAL)


def grpc_error(error: BaseException) -> GrpcError:
    """`error` as a gRPC status and message: the OpenAI error message, naming its `param` (500s are
    logged by `error_reply`)."""
    reply = error_reply(error)
    message, param = reply.detail.message, reply.detail.param
    if param is not None and f"`{param}`" not in message:
        message = f"{message} (`{param}`)"
    return GrpcError(grpc_code(reply.status), message, reply.status)
