"""The response cache through the real gateway, with the openai SDK and a real upstream on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.auth import hash_key
from proxy.cache.settings import CacheSettings
from proxy.settings import ApiKeySettings, AuthSettings
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import Fault, UpstreamServer

KEYS = {"acme": "sk-acme", "globex": "sk-globex"}
ADMIN_KEY = "sk-ops"
MESSAGES: Any = [{"role": "user", "content": "Say hello."}]


def _auth() -> AuthSettings:
    keys = [ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()]
    return AuthSettings(
        api_keys=[*keys, ApiKeySettings(tenant="ops", sha256=hash_key(ADMIN_KEY), admin=True)]
    )


@pytest.fixture(scope="module")
def cache_gateway(upstream_server: UpstreamServer) -> Iterator[GatewayServer]:
    server = GatewayServer(create_app(gateway_settings(upstream_server.url, auth=_auth()))).start()
    yield server
    server.stop()


@pytest.fixture
def gateway(cache_gateway: GatewayServer, upstream: UpstreamServer) -> GatewayServer:
    """The module's gateway with an empty response cache."""
    cleared = httpx.post(f"{cache_gateway.url}/cache/clear", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert cleared.status_code == 200
    upstream.requests.clear()
    return cache_gateway


def sdk(gateway: GatewayServer, tenant: str = "acme") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=KEYS[tenant], max_retries=0, timeout=10)


def chat(client: openai.OpenAI, **options: Any) -> tuple[str, Any]:
    """(x-radixgate-cache, the parsed answer) of one chat completion."""
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, **options)
    return raw.headers["x-radixgate-cache"], raw.parse()


@pytest.mark.parametrize("options", [{"temperature": 0}, {"temperature": 0.9, "seed": 5}])
def test_a_repeated_deterministic_request_is_answered_from_the_cache(
    gateway: GatewayServer, upstream: UpstreamServer, options: dict[str, Any]
) -> None:
    with sdk(gateway) as client:
        first = chat(client, max_tokens=4, **options)
        second = chat(client, max_tokens=4, **options)
    assert (first[0], second[0]) == ("miss", "hit")
    assert second[1].model_dump() == first[1].model_dump()
    assert len(upstream.generation_requests()) == 1


def test_sampled_requests_bypass_the_cache(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    with sdk(gateway) as client:
        outcomes = [chat(client, temperature=0.9)[0], chat(client)[0]]
    assert outcomes == ["bypass", "bypass"]
    assert len(upstream.generation_requests()) == 2


def test_a_parameter_change_is_a_different_entry(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    with sdk(gateway) as client:
        outcomes = [chat(client, temperature=0, max_tokens=n)[0] for n in (2, 3, 2)]
        outcomes.append(chat(client, temperature=0, max_tokens=2, stop=["."])[0])
    assert outcomes == ["miss", "miss", "hit", "miss"]
    assert len(upstream.generation_requests()) == 3


def test_a_replayed_stream_has_the_same_chunks_and_parses_in_the_sdk(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    options: dict[str, Any] = {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with sdk(gateway) as client:
        answers = []
        for _ in range(2):
            raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, **options)
            answers.append((raw.headers["x-radixgate-cache"], [c.model_dump() for c in raw.parse()]))
    (miss, first), (hit, second) = answers
    assert (miss, hit) == ("miss", "hit")
    assert second == first and len(first) > 3
    assert "".join(c["choices"][0]["delta"]["content"] or "" for c in first if c["choices"]) == (
        "Hello from the test upstream."
    )
    assert first[-1]["usage"]["completion_tokens"] == 6
    assert len(upstream.generation_requests()) == 1


def test_replayed_stream_bytes_are_identical(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    body = {"model": MODEL, "prompt": "once", "temperature": 0, "stream": True}
    headers = {"authorization": f"Bearer {KEYS['acme']}"}
    streams = [httpx.post(f"{gateway.url}/completions", json=body, headers=headers) for _ in range(2)]
    assert [s.headers["x-radixgate-cache"] for s in streams] == ["miss", "hit"]
    assert streams[0].headers["content-type"].startswith("text/event-stream")
    assert streams[1].content == streams[0].content and streams[0].content.endswith(b"data: [DONE]\n\n")
    assert len(upstream.generation_requests()) == 1


def test_streamed_and_json_answers_are_cached_separately(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    with sdk(gateway) as client:
        json_outcome = chat(client, temperature=0)[0]
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, temperature=0, stream=True
        )
        list(raw.parse())
        again = chat(client, temperature=0)[0]
    assert (json_outcome, raw.headers["x-radixgate-cache"], again) == ("miss", "miss", "hit")


def test_no_cache_refreshes_and_no_store_leaves_the_cache_alone(
    gateway: GatewayServer, upstream: UpstreamServer
) -> None:
    with sdk(gateway) as client:
        stored = chat(client, temperature=0)
        refreshed = chat(client, temperature=0, extra_headers={"Cache-Control": "no-cache"})
        after_refresh = chat(client, temperature=0)
        no_store = chat(client, temperature=0, max_tokens=3, extra_headers={"Cache-Control": "no-store"})
        after_no_store = chat(client, temperature=0, max_tokens=3)
    assert [o for o, _ in (stored, refreshed, after_refresh, no_store, after_no_store)] == [
        "miss",
        "miss",
        "hit",
        "bypass",
        "miss",
    ]
    assert refreshed[1].id != stored[1].id and after_refresh[1].id == refreshed[1].id
    assert len(upstream.generation_requests()) == 4


def test_tenants_do_not_see_each_other_s_answers(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    with sdk(gateway, "acme") as acme, sdk(gateway, "globex") as globex:
        outcomes = [
            chat(acme, temperature=0)[0],
            chat(globex, temperature=0)[0],
            chat(acme, temperature=0)[0],
        ]
    assert outcomes == ["miss", "miss", "hit"]
    assert len(upstream.generation_requests()) == 2


def test_tenants_share_answers_when_configured(upstream: UpstreamServer) -> None:
    settings = gateway_settings(upstream.url, auth=_auth(), cache=CacheSettings(share_across_tenants=True))
    server = GatewayServer(create_app(settings)).start()
    try:
        with sdk(server, "acme") as acme, sdk(server, "globex") as globex:
            outcomes = [chat(acme, temperature=0)[0], chat(globex, temperature=0)[0]]
    finally:
        server.stop()
    assert outcomes == ["miss", "hit"]


def test_response_cache_off_answers_bypass(upstream: UpstreamServer) -> None:
    server = GatewayServer(
        create_app(gateway_settings(upstream.url, cache=CacheSettings(response_cache=False)))
    )
    server.start()
    try:
        with openai.OpenAI(base_url=server.url, api_key="k", max_retries=0) as client:
            outcomes = [chat(client, temperature=0)[0] for _ in range(2)]
    finally:
        server.stop()
    assert outcomes == ["bypass", "bypass"]


@pytest.mark.parametrize(
    ("fault", "stream"),
    [
        (Fault(status=400), False),
        (Fault(drop_after_chunks=2), True),
        (Fault(inband_error_after_chunks=2), True),
    ],
    ids=["http-error", "cut-mid-stream", "error-event"],
)
def test_failed_or_cut_answers_are_never_stored(
    gateway: GatewayServer, upstream: UpstreamServer, fault: Fault, stream: bool
) -> None:
    upstream.faults.append(fault)
    with sdk(gateway) as client:
        with pytest.raises(openai.APIError):
            if stream:
                list(
                    client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, stream=True)
                )
            else:
                client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, temperature=0, stream=stream
        )
        answer = raw.parse()
        if stream:
            list(answer)  # type: ignore[call-overload]
    assert raw.headers["x-radixgate-cache"] == "miss"
    assert len(upstream.generation_requests()) == 2


def test_a_stream_the_client_abandons_is_not_stored(gateway: GatewayServer, upstream: UpstreamServer) -> None:
    upstream.faults.append(Fault(chunk_delay_s=0.1))
    with sdk(gateway) as client:
        stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, stream=True)
        next(iter(stream))
        stream.close()
        assert upstream.generation_requests()[0].disconnected.wait(5)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, temperature=0, stream=True
        )
        list(raw.parse())
    assert raw.headers["x-radixgate-cache"] == "miss"
    assert len(upstream.generation_requests()) == 2
