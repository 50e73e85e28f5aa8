"""Engine errors, each carrying the HTTP status and OpenAI error fields the proxy returns.

    EngineError                      any failure an adapter reports
    ├── UpstreamTimeout              504  the engine did not answer in time
    ├── UpstreamUnreachable          502  connection refused, reset or dropped
    ├── EngineOverloaded             503  queue full, no healthy worker, circuit open
    ├── UpstreamStatusError          the engine's own 4xx is relayed; its 5xx becomes 502
    ├── InBandError                  an error event inside a stream (vLLM/SGLang `data: {"error":...}`)
    └── InvalidRequest               400  a request the engine cannot serve as given (sampling values, length)

Adapters raise these before the first chunk (the proxy answers with the status) or while
streaming (the proxy sends an error event and ends the stream).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class. `status`, `error_type`, `code` and `param` shape the OpenAI error body."""

    status: int = 502
    error_type: str = "upstream_error"
    code: str | None = None
    retryable: bool = False

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class UpstreamTimeout(EngineError):
    status = 504
    error_type = "timeout_error"
    code = "upstream_timeout"
    retryable = True


class UpstreamUnreachable(EngineError):
    status = 502
    error_type = "upstream_error"
    code = "upstream_unreachable"
    retryable = True


class EngineOverloaded(EngineError):
    status = 503
    error_type = "server_overloaded"
    code = "engine_overloaded"
    retryable = True


class UpstreamStatusError(EngineError):
    """A non-2xx answer from the engine; 4xx is relayed as is, 5xx becomes 502."""

    def __init__(
        self,
        upstream_status: int,
        message: str,
        *,
        error_type: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.upstream_status = upstream_status
        self.status = upstream_status if 400 <= upstream_status < 500 else 502
        self.error_type = error_type or ("invalid_request_error" if self.status < 500 else "upstream_error")
        self.retryable = upstream_status == 429 or upstream_status >= 500


class InBandError(EngineError):
    """An error event the engine sent inside an SSE stream."""

    status = 502
    error_type = "upstream_error"
    code = "upstream_stream_error"


class InvalidRequest(EngineError):
    """The request cannot be served as given (bad sampling value, prompt too long); 400."""

    status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"
