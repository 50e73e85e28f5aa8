"""The gateway with no upstream configured, serving the embedded engine, driven by the openai SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import openai
import pytest

from adapters.local import LocalEngine, LocalEngineConfig
from proxy.app import create_app
from proxy.routing.from_settings import build_pool
from proxy.settings import Settings
from tests.e2e.local_gateway import local_gateway
from tests.gateway_server import GatewayServer

pytestmark = pytest.mark.slow

ENGINE = LocalEngineConfig(threads=1, kv_budget_tokens=8192, max_running=4)
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[GatewayServer, LocalEngine]]:
    settings = Settings(local_engine=ENGINE)
    pool = build_pool(settings)
    engine = pool.workers()[0].engine
    assert isinstance(engine, LocalEngine)
    server = GatewayServer(create_app(settings, router=pool)).start()
    yield server, engine
    server.stop()


@pytest.fixture
def client(served: tuple[GatewayServer, LocalEngine]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[0].url, api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


def test_models_lists_the_embedded_model(client: openai.OpenAI) -> None:
    assert ENGINE.model_id in [m.id for m in client.models.list()]


def test_chat_answers_paris(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=ENGINE.model_id, messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=24
    )
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens > 0


def test_streaming_equals_non_streaming_under_greedy(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three rivers in Europe."}]
    whole = client.chat.completions.create(
        model=ENGINE.model_id, messages=messages, temperature=0, max_tokens=40
    )
    stream = client.chat.completions.create(
        model=ENGINE.model_id,
        messages=messages,
        temperature=0,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_shared_prefix_reports_cached_tokens(client: openai.OpenAI) -> None:
    system = {"role": "system", "content": "You describe lighthouses at night, in detail. " * 8}
    for question, expect_cached in (("Describe one in fog.", False), ("Describe one in a storm.", True)):
        messages = [system, {"role": "user", "content": question}]
        answer = client.chat.completions.create(
            model=ENGINE.model_id, messages=messages, temperature=0, max_tokens=2
        )
        details = answer.usage.prompt_tokens_details if answer.usage is not None else None
        assert details is not None and details.cached_tokens is not None
        assert (details.cached_tokens >= 64) == expect_cached


def test_disconnecting_frees_the_pages(
    client: openai.OpenAI, served: tuple[GatewayServer, LocalEngine]
) -> None:
    engine = served[1]
    baseline = engine.stats()
    assert baseline is not None and baseline.active_pages == 0
    stream = client.chat.completions.create(
        model=ENGINE.model_id,
        messages=[{"role": "user", "content": "Tell a very long story about the sea."}],
        max_tokens=500,
        stream=True,
    )
    for received, _ in enumerate(stream):
        if received == 3:
            break
    busy = engine.stats()
    assert busy is not None and busy.active_pages > 0
    stream.close()
    deadline = time.monotonic() + 10
    while True:
        stats = engine.stats()
        assert stats is not None
        if stats.active_pages == 0 and stats.running == 0:
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)


def test_torchs_kernels_answer_paris_too() -> None:
    """The path of a host without the C kernels (torch's packed-weight kernels, `c_kernels = false`),
    served by the gateway like any other: the same answer."""
    with (
        local_gateway(replace(ENGINE, c_kernels=False)) as server,
        openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120) as sdk,
    ):
        answer = sdk.chat.completions.create(
            model=ENGINE.model_id,
            messages=[{"role": "user", "content": QUESTION}],
            temperature=0,
            max_tokens=24,
        )
    assert "Paris" in (answer.choices[0].message.content or "")
