"""An HTTP/1.1 transport for `httpx.AsyncClient`, built for many small requests to a few upstreams.

httpx's default transport (httpcore) drives h11, a pure-Python parser, through anyio and scans
its whole pool on every checkout; under load that is most of the gateway's CPU. `FastTransport`
keeps httpx's client, requests, responses and exceptions and replaces what is under them:

    connection.py  asyncio protocol + httptools (C) parser, flow control both ways, errors as httpx's
    exchange.py    write a request head and a streamed body, stream a response body
    pool.py        per-origin LIFO stacks of idle keep-alive connections, slots for max_connections
    transport.py   `FastTransport.handle_async_request`: checkout, exchange, retry a stale connection

    client = httpx.AsyncClient(transport=FastTransport(limits=httpx.Limits(...)), timeout=...)

Plain HTTP/1.1 only: https URLs are handed to httpx's own transport, and there is no proxy
support (the adapters never use one).
"""

from adapters.http_transport.connection import Origin
from adapters.http_transport.exchange import ResponseBody
from adapters.http_transport.transport import FastTransport, Timeouts, WholeResponse

__all__ = ["FastTransport", "Origin", "ResponseBody", "Timeouts", "WholeResponse"]
