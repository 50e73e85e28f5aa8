"""Many streams at once through one gateway, each one complete and uncrossed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from adapters.openai_compat import UpstreamClientConfig
from proxy.app import create_app
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import UpstreamServer

STREAMS = 200
ANSWER = "Hello from the test upstream."
READ_TIMEOUT_S = 60.0
"""Two hundred streams on a 2-core CI box can keep an upstream silent longer than the shared
fixture's short read timeout; this test is about correctness under concurrency, not latency."""


@pytest.fixture(scope="module")
def gateway(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    settings = gateway_settings(
        upstream_server.url, upstream_client=UpstreamClientConfig(read_timeout_s=READ_TIMEOUT_S)
    )
    server = GatewayServer(create_app(settings)).start()
    yield server
    server.stop()


async def test_200_concurrent_streams_are_all_correct(
    async_client: openai.AsyncOpenAI, upstream: UpstreamServer
) -> None:
    async def one(number: int) -> tuple[set[str], str, int]:
        stream = await async_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"request {number}"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        ids: set[str] = set()
        text = ""
        usage_tokens = 0
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            elif chunk.usage is not None:
                usage_tokens = chunk.usage.completion_tokens
        return ids, text, usage_tokens

    results = await asyncio.gather(*(one(number) for number in range(STREAMS)))
    assert all(text == ANSWER for _, text, _ in results)
    assert all(tokens == 6 for _, _, tokens in results)
    assert all(len(ids) == 1 for ids, _, _ in results)
    assert len(set().union(*(ids for ids, _, _ in results))) == STREAMS  # no chunk reached the wrong client
    bodies = {request.json["messages"][0]["content"] for request in upstream.generation_requests()}
    assert bodies == {f"request {number}" for number in range(STREAMS)}
