"""Every error the gateway answers, in OpenAI's shape `{"error": {"message", "type", "param", "code"}}`.

`ApiError` is what request handling raises for the client's mistakes; `adapters.errors.EngineError`
carries the upstream's. `error_reply` is the one mapping of an exception to a status, an OpenAI error
object and headers, for every front door: the HTTP app's `EXCEPTION_HANDLERS` (which also convert
Litestar's own `HTTPException`s: unknown route, wrong method) and a stream's error event use it, so
no answer escapes the shape.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any, NamedTuple

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, MethodNotAllowedException, NotFoundException
from litestar.types import ExceptionHandlersMap

from adapters.errors import EngineError

logger = logging.getLogger("radixgate.errors")

JSON = "application/json"


class ErrorDetail(msgspec.Struct, kw_only=True):
    """OpenAI's error object; `param` and `code` are always present, null when unknown."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorDetail


class ApiError(Exception):
    """A request the gateway refuses, with the HTTP status and OpenAI error fields to answer."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.detail = ErrorDetail(message=message, type=error_type, param=param, code=code)
        self.headers = headers

    @classmethod
    def model_not_found(cls, model: str) -> ApiError:
        return cls(
            404,
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )

    @classmethod
    def body_too_large(cls, limit: int) -> ApiError:
        return cls(413, f"The request body is larger than {limit} bytes.", code="request_too_large")

    @classmethod
    def invalid_json(cls, reason: str) -> ApiError:
        return cls(400, f"We could not parse the JSON body of your request: {reason}", code="invalid_json")

    @classmethod
    def invalid_body(cls, error: msgspec.ValidationError) -> ApiError:
        """A body that is JSON but not a valid request; `param` names the field, e.g. `messages[0].role`."""
        message, param = split_validation_error(str(error))
        return cls(400, f"Invalid request: {message}", param=param, code="invalid_value")

    @classmethod
    def duplicate_header(cls, name: str) -> ApiError:
        """Two values of a header that must have one: which one counts would be a guess."""
        return cls(400, f"The {name} header appears more than once; send it once.", code="invalid_header")

    @classmethod
    def method_not_allowed(cls, method: str, path: str, allowed: str) -> ApiError:
        return cls(
            405,
            f"Method {method} is not allowed for {path}; use {allowed}.",
            code="method_not_allowed",
            headers={"allow": allowed},
        )


class ErrorReply(NamedTuple):
    """What a front door answers for an exception."""

    status: int
    detail: ErrorDetail
    headers: dict[str, str] | None = None


INTERNAL_ERROR = ErrorDetail(message="The gateway hit an internal error.", type="server_error")


def error_reply(error: BaseException) -> ErrorReply:
    """The answer to `error`: the client's mistake (`ApiError`), the upstream's (`EngineError`), or a
    500 for anything else (logged here, with its traceback)."""
    if isinstance(error, ApiError):
        return ErrorReply(error.status, error.detail, error.headers)
    if isinstance(error, EngineError):
        return ErrorReply(error.status, engine_error_detail(error))
    logger.error("unhandled error", exc_info=error)
    return ErrorReply(500, INTERNAL_ERROR)


def encode_error(detail: ErrorDetail) -> bytes:
    return _encoder.encode(ErrorResponse(error=detail))


def engine_error_detail(error: EngineError) -> ErrorDetail:
    return ErrorDetail(message=error.message, type=error.error_type, param=error.param, code=error.code)


_AT_PATH = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_NAMED_FIELD = re.compile(r"^Object (?:missing required|contains unknown) field `(?P<field>[^`]+)`$")


def split_validation_error(text: str) -> tuple[str, str | None]:
    """Split msgspec's "Expected `str`, got `int` - at `$.messages[0].role`" into the message and
    the dotted path ("messages[0].role"); a missing or unknown field is named in the path too."""
    match = _AT_PATH.match(text)
    if match is None:
        return text, None
    message, path = match["message"], (match["path"] or "").lstrip(".")
    field = _NAMED_FIELD.match(message)
    if field is not None:
        path = f"{path}.{field['field']}" if path else field["field"]
    return message, path or None


def _error(_: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    return _response(*error_reply(exc))


def _http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    method, path = request.method, request.url.path
    if isinstance(exc, NotFoundException):
        detail = ErrorDetail(
            message=f"Invalid URL ({method} {path})", type="invalid_request_error", code="unknown_url"
        )
        return _response(404, detail)
    if isinstance(exc, MethodNotAllowedException):
        headers = {name.lower(): value for name, value in (exc.headers or {}).items()}
        allowed = headers.get("allow", "")
        error = ApiError.method_not_allowed(method, path, allowed)
        return _response(405, error.detail, error.headers)
    status = exc.status_code
    error_type = "invalid_request_error" if status < 500 else "server_error"
    message = exc.detail or HTTPStatus(status).phrase
    return _response(status, ErrorDetail(message=message, type=error_type), exc.headers)


def _response(status: int, detail: ErrorDetail, headers: dict[str, str] | None = None) -> Response[bytes]:
    return Response(encode_error(detail), status_code=status, media_type=JSON, headers=headers)


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ApiError: _error,
    EngineError: _error,
    HTTPException: _http_exception,
    Exception: _error,
}
"""Litestar `exception_handlers`: every error response the app can produce is OpenAI-shaped."""

_encoder = msgspec.json.Encoder()
