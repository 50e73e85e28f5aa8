"""Adapter for any server that speaks OpenAI's `/v1` API (vLLM, SGLang, llama.cpp, OpenAI itself).

The client's raw request body is forwarded byte for byte, so fields radixgate does not know
reach the upstream unchanged; answers come back as raw bytes too. The HTTP client is
`adapters.upstream_client.UpstreamClient` (by default over `adapters.http_transport`, which raises
httpx's exceptions like httpx's own transport). httpx errors become the `adapters.errors` hierarchy:

    connect error, connect timeout    -> UpstreamUnreachable (502, retryable)
    read or write timeout             -> UpstreamTimeout (504, retryable)
    local connection pool exhausted   -> EngineOverloaded (503, retryable)
    other transport errors            -> UpstreamUnreachable (502)
    non-2xx answer                    -> UpstreamStatusError (4xx relayed, 5xx as 502)
    `data: {"error": ...}` in a stream -> InBandError
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from urllib.parse import quote

import httpx
import msgspec

from adapters.base import Completion, EngineRequest
from adapters.errors import (
    EngineError,
    EngineOverloaded,
    InBandError,
    UpstreamStatusError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from adapters.schema import ErrorProbe, ResponseProbe, probe_response
from adapters.sse import DONE, SSEDecoder, SSEEvent
from adapters.upstream_client import UpstreamClient, body_chunks
from adapters.upstream_client import UpstreamClientConfig as UpstreamClientConfig  # its historic home

_PATHS = {
    "chat": "chat/completions",
    "text_completion": "completions",
    "embeddings": "embeddings",
    "responses": "responses",
}
_NOT_SERVED = frozenset({404, 405})
"""Statuses of a server that has no such route (a server that has it refuses an empty body as invalid)."""
_ERROR_SNIPPET_CHARS = 300


def api_root(base_url: str) -> str:
    """`http://h:8000`, `http://h:8000/` and `http://h:8000/v1/` all become `http://h:8000/v1`."""
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


class OpenAICompatEngine:
    """One OpenAI-compatible upstream behind one shared `UpstreamClient` (its pool is per upstream)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        provider_name: str = "openai",
        config: UpstreamClientConfig | None = None,
    ) -> None:
        self.config = config or UpstreamClientConfig()
        self.provider_name = provider_name
        root = api_root(base_url)
        self._urls = {op: httpx.URL(f"{root}/{path}") for op, path in _PATHS.items()}
        self._models_url = httpx.URL(f"{root}/models")
        self.server_address: str = self._models_url.host
        self.server_port: int | None = self._models_url.port or (
            443 if self._models_url.scheme == "https" else 80
        )
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        # One client per upstream so its pool limits are per upstream.
        self._upstream = UpstreamClient(self.config, headers)
        self._client = self._upstream.http

    def __repr__(self) -> str:
        return f"OpenAICompatEngine({self._models_url.copy_with(path='/')!s})"

    async def complete(self, request: EngineRequest) -> Completion:
        """POST the raw body and return the upstream's JSON answer unchanged."""
        url = self._urls[request.operation]
        try:
            response = await self._upstream.post(url, request.raw_body, _headers(request))
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=False) from exc
        if response.status_code >= 300:
            raise status_error(response.status_code, response.content)
        body = response.content
        try:
            probe = probe_response(body)
        except msgspec.DecodeError as exc:
            raise _error_in(body) or EngineError(
                f"upstream answered with invalid JSON: {_snippet(body)}"
            ) from exc
        if probe.error is not None:
            raise _in_band_error(probe.error)
        completion = _completion(body, probe)
        completion.whole = request.operation in ("embeddings", "responses")  # no choices to finish
        return completion

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        """POST the raw body and yield each SSE `data` payload; closing the iterator closes the
        connection, which is how the upstream learns that the client went away."""
        url = self._urls[request.operation]
        try:
            response = await self._upstream.post_streaming(url, request.raw_body, _headers(request))
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=False) from exc
        try:
            await _raise_for_non_stream(response)
            decoder = SSEDecoder()
            async for raw in body_chunks(response):
                for event in decoder.feed(raw):
                    if event.data == DONE:
                        return
                    yield _checked(event)
            for event in decoder.flush():
                if event.data != DONE:
                    yield _checked(event)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=True) from exc
        finally:
            await response.aclose()

    async def list_models(self) -> list[str]:
        """The model ids the upstream serves (`GET /v1/models`)."""
        try:
            response = await self._client.get(self._models_url, timeout=self.config.health_timeout_s)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, mid_stream=False) from exc
        if response.status_code != 200:
            raise status_error(response.status_code, response.content)
        try:
            listing = _model_list_decoder.decode(response.content)
        except msgspec.DecodeError as exc:
            raise EngineError(
                f"upstream /v1/models is not a model list: {_snippet(response.content)}"
            ) from exc
        return [entry.id for entry in listing.data]

    async def serves_responses(self) -> bool:
        """Whether the upstream serves `POST /v1/responses`: one that does refuses an empty request as
        invalid (400, 422); one that does not answers 404 or 405."""
        try:
            response = await self._client.post(
                self._urls["responses"], content=b"{}", timeout=self.config.health_timeout_s
            )
        except httpx.HTTPError:
            return False
        return response.status_code < 500 and response.status_code not in _NOT_SERVED

    async def delete_response(self, response_id: str) -> bool:
        """`DELETE /v1/responses/{id}` on the upstream; False when it failed or had none."""
        base = self._urls["responses"]
        url = base.copy_with(path=f"{base.path}/{quote(response_id, safe='')}")
        try:
            response = await self._client.delete(url, timeout=self.config.health_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def check_health(self) -> bool:
        """True when `GET /v1/models` answers 200 with a model list."""
        try:
            await self.list_models()
        except EngineError:
            return False
        return True

    async def aclose(self) -> None:
        await self._upstream.aclose()


class _ModelEntry(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_ModelEntry]


class _ErrorBody(msgspec.Struct):
    """OpenAI's `{"error": {...}}`, vLLM/SGLang's flat `{"object": "error", "message": ...}`,
    or a framework's `{"detail": ...}`."""

    error: ErrorProbe | str | None = None
    message: str | None = None
    type: str | None = None
    param: str | None = None
    code: str | int | None = None
    detail: str | list[object] | None = None


_model_list_decoder = msgspec.json.Decoder(_ModelList)
_error_body_decoder = msgspec.json.Decoder(_ErrorBody)


def status_error(status: int, body: bytes) -> UpstreamStatusError:
    """The upstream's non-2xx answer as an error that keeps its message, type, param and code."""
    try:
        parsed = _error_body_decoder.decode(body)
    except msgspec.DecodeError:
        parsed = _ErrorBody()
    if isinstance(parsed.error, ErrorProbe):
        error = parsed.error
    elif parsed.message is not None or isinstance(parsed.error, str):
        message = parsed.message if parsed.message is not None else str(parsed.error)
        error = ErrorProbe(message=message, type=parsed.type, param=parsed.param, code=parsed.code)
    elif parsed.detail is not None:
        error = ErrorProbe(message=str(parsed.detail))
    else:
        error = ErrorProbe(message=f"upstream answered HTTP {status}: {_snippet(body)}")
    return UpstreamStatusError(
        status,
        error.message or f"upstream answered HTTP {status}",
        error_type=error.type if status < 500 else None,
        param=error.param,
        code=_code(error.code),
    )


def _headers(request: EngineRequest) -> Mapping[str, str] | None:
    return request.trace_headers or None


def _code(code: str | int | None) -> str | None:
    # vLLM and SGLang put the HTTP status in `code`; OpenAI's `code` is a string name or null.
    return code if isinstance(code, str) else None


def _snippet(body: bytes) -> str:
    return body[:_ERROR_SNIPPET_CHARS].decode("utf-8", "replace")


def _transport_error(exc: httpx.HTTPError, *, mid_stream: bool) -> EngineError:
    where = "while streaming" if mid_stream else "before answering"
    if isinstance(exc, httpx.PoolTimeout):
        return EngineOverloaded("all connections to the upstream are busy")
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return UpstreamUnreachable(f"cannot connect to the upstream: {str(exc) or type(exc).__name__}")
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"the upstream timed out {where}")
    return UpstreamUnreachable(f"the upstream connection failed {where}: {type(exc).__name__}")


async def _raise_for_non_stream(response: httpx.Response) -> None:
    if response.status_code >= 300:
        raise status_error(response.status_code, await response.aread())
    content_type = response.headers.get("content-type", "")
    if not content_type.startswith("text/event-stream"):
        error = _error_in(await response.aread())
        if error is not None:
            raise error
        raise EngineError(f"upstream answered a stream request with {content_type or 'no content type'}")


def _checked(event: SSEEvent) -> bytes:
    """The event's payload, unless it is an error event."""
    data = event.data
    if event.event == "error":
        raise _error_in(data) or InBandError(data.decode("utf-8", "replace") or "the upstream sent an error")
    # Cheap test first: only a payload containing `"error"` can carry a top-level error. (`find`, not
    # `in`: `bytes in bytes` first tries the needle as an int, raising and formatting a TypeError.)
    if data.find(b'"error"') >= 0:
        error = _error_in(data)
        if error is not None:
            raise error
    return data


def _error_in(payload: bytes) -> InBandError | None:
    """The top-level `error` of a JSON payload (an object or a bare string), if it has one."""
    try:
        parsed = _error_body_decoder.decode(payload)
    except msgspec.DecodeError:
        return None
    if isinstance(parsed.error, ErrorProbe):
        return _in_band_error(parsed.error)
    if isinstance(parsed.error, str):
        return InBandError(parsed.error)
    return None


def _in_band_error(error: ErrorProbe) -> InBandError:
    return InBandError(
        error.message or "the upstream reported an error", param=error.param, code=_code(error.code)
    )


def _completion(body: bytes, probe: ResponseProbe) -> Completion:
    return Completion(
        body=body,
        usage=probe.usage,
        response_id=probe.id,
        response_model=probe.model,
        finish_reasons=[choice.finish_reason for choice in probe.choices if choice.finish_reason],
        choices=len(probe.choices),
    )
