"""The HTTP client each upstream gets: its settings (`[upstream_client]`) and `UpstreamClient`.

`UpstreamClient` wraps one `httpx.AsyncClient` (health checks, metrics, every other call) and,
with the fast transport, sends the gateway's hot-path POSTs straight to `FastTransport`:
httpx's client layer (header merging, auth and redirect flows, cookies, event hooks) cost as
much CPU per request as the transport under it. Either way callers get an `httpx.Response`
and httpx's exceptions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Literal, NamedTuple

import httpx
import msgspec

from adapters.http_transport import FastTransport, Origin, ResponseBody, Timeouts

DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_READ_TIMEOUT_S = 300.0
DEFAULT_WRITE_TIMEOUT_S = 30.0
DEFAULT_POOL_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_KEEPALIVE_CONNECTIONS = 256
DEFAULT_KEEPALIVE_EXPIRY_S = 4.0  # under the 5 s idle timeout of uvicorn and SGLang servers
DEFAULT_HEALTH_TIMEOUT_S = 2.0

TransportName = Literal["fast", "httpx"]
DEFAULT_TRANSPORT: TransportName = "fast"


class UpstreamClientConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Connection pool and timeouts of the HTTP client each upstream gets."""

    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    """Seconds to open a TCP connection to the upstream."""
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    """Seconds to wait for the answer, and between two chunks of a stream."""
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    """Seconds to send the request body."""
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S
    """Seconds to wait for a free connection when `max_connections` are busy (then 503)."""
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Concurrent connections to one upstream; one per in-flight request."""
    max_keepalive_connections: int = DEFAULT_MAX_KEEPALIVE_CONNECTIONS
    """Idle connections kept open for reuse."""
    keepalive_expiry_s: float = DEFAULT_KEEPALIVE_EXPIRY_S
    """Seconds an idle connection stays in the pool."""
    health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S
    """Seconds a health check (`GET /v1/models`) may take."""
    transport: TransportName = DEFAULT_TRANSPORT
    """`fast`: `adapters.http_transport` (HTTP/1.1 on asyncio + httptools, ~4x less CPU per request;
    https upstreams still go through httpx's transport); `httpx`: httpx's default (httpcore)."""

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self.connect_timeout_s,
            read=self.read_timeout_s,
            write=self.write_timeout_s,
            pool=self.pool_timeout_s,
        )

    def limits(self) -> httpx.Limits:
        return httpx.Limits(
            max_connections=self.max_connections,
            max_keepalive_connections=self.max_keepalive_connections,
            keepalive_expiry=self.keepalive_expiry_s,
        )

    def build_client(
        self, headers: Mapping[str, str], transport: httpx.AsyncBaseTransport | None = None
    ) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` with these limits and timeouts, sending `headers`, over `transport`
        (None: httpx's own)."""
        # trust_env=False: upstreams are internal; an HTTP(S)_PROXY meant for the internet must not
        # capture them.
        return _UpstreamHTTPClient(
            headers=headers,
            timeout=self.timeout(),
            limits=self.limits(),
            transport=transport,
            trust_env=False,
        )


class UpstreamAnswer(NamedTuple):
    """A whole answer: what the request path needs of it."""

    status_code: int
    content: bytes


class UpstreamClient:
    """One upstream's client: `http` for any call, `post` and `post_streaming` for the request path."""

    def __init__(self, config: UpstreamClientConfig, headers: Mapping[str, str]) -> None:
        self._fast = FastTransport(limits=config.limits()) if config.transport == "fast" else None
        self.http: httpx.AsyncClient = config.build_client(headers, self._fast)
        self._headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        self._timeout = config.timeout().as_dict()
        self._timeouts = Timeouts(
            config.connect_timeout_s, config.read_timeout_s, config.write_timeout_s, config.pool_timeout_s
        )
        self._targets: dict[int, _Target] = {}

    async def post(self, url: httpx.URL, body: bytes, headers: Mapping[str, str] | None) -> UpstreamAnswer:
        """POST `body` with the client's headers plus `headers` and read the whole answer."""
        fast = self._fast
        target = None if fast is None else self._target(url)
        if fast is None or target is None or not target.plain_http:
            response = await self.http.post(url, content=body, headers=headers)
            return UpstreamAnswer(response.status_code, response.content)
        head = [target.head, b"content-length: %d\r\n" % len(body)]
        if headers:
            head += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
        head += (b"\r\n", body)
        answer = await fast.send_whole(target.origin, b"".join(head), self._timeouts)
        for name, _ in answer.headers:
            if name.lower() == b"content-encoding":  # upstreams are asked for identity; httpx decodes it
                decoded = httpx.Response(answer.status, headers=answer.headers, content=answer.body)
                return UpstreamAnswer(answer.status, decoded.content)
        return UpstreamAnswer(answer.status, answer.body)

    async def post_streaming(
        self, url: httpx.URL, body: bytes, headers: Mapping[str, str] | None
    ) -> httpx.Response:
        """POST like `post` and return as soon as the answer's head arrived; close the response."""
        if self._fast is None or url.scheme != "http":
            request = self.http.build_request("POST", url, content=body, headers=headers)
            return await self.http.send(request, stream=True)
        request = self._request(url, body, headers)
        response = await self._fast.handle_async_request(request)
        response.request = request
        return response

    def _target(self, url: httpx.URL) -> _Target:
        """The origin and the fixed part of a request head for `url` (the adapters' URLs are few
        and long-lived, so they are prepared once)."""
        target = self._targets.get(id(url))
        if target is None or target.url is not url:
            lines = [b"POST ", url.raw_path, b" HTTP/1.1\r\nhost: ", url.netloc, b"\r\n"]
            for name, value in self._headers:
                lines += (name, b": ", value, b"\r\n")
            target = _Target(url, url.scheme == "http", Origin(url.host, url.port or 80), b"".join(lines))
            if len(self._targets) >= _MAX_TARGETS:  # a caller building a URL per request: stay bounded
                self._targets.clear()
            self._targets[id(url)] = target
        return target

    def _request(self, url: httpx.URL, body: bytes, headers: Mapping[str, str] | None) -> httpx.Request:
        raw = [(b"host", url.netloc), *self._headers, (b"content-length", b"%d" % len(body))]
        if headers:
            raw += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        # Given a stream, httpx.Request skips its header preparation: the head above is complete.
        return httpx.Request(
            "POST", url, headers=raw, stream=httpx.ByteStream(body), extensions={"timeout": self._timeout}
        )

    async def aclose(self) -> None:
        await self.http.aclose()


_MAX_TARGETS = 64
"""Prepared request heads kept per client; an adapter posts to a handful of fixed URLs."""


class _Target(NamedTuple):
    url: httpx.URL
    """Kept so its id cannot be reused by another URL while the entry exists."""
    plain_http: bool
    """Only `http` URLs go to the fast transport (asked once: httpx's `URL.scheme` is a Python call)."""
    origin: Origin
    head: bytes
    """`POST path HTTP/1.1`, Host and the client's headers."""


def body_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """A streaming response's body as it arrives: straight from `FastTransport` when it is not
    content-encoded (upstreams are asked for identity), else through httpx's decoders."""
    stream = response.stream
    if isinstance(stream, ResponseBody) and "content-encoding" not in response.headers:
        return stream.__aiter__()
    return response.aiter_bytes()


class _NoCookies(httpx.Cookies):
    """A cookie jar that never stores: a `Set-Cookie` from an upstream must not ride along on later
    requests of other tenants, and parsing responses for cookies costs ~40 calls per request."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class _UpstreamHTTPClient(httpx.AsyncClient):
    """httpx's client without cookie handling."""

    _no_cookies = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies

    @cookies.setter
    def cookies(self, cookies: object) -> None:
        raise AttributeError("the upstream client keeps no cookies")
