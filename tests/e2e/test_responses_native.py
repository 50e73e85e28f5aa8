"""`/v1/responses` passed through to workers that serve the Responses API themselves (detected at
start, or configured), by the openai SDK: bodies and events unchanged, conversations pinned to the
worker that keeps them, per tenant."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from proxy.app import create_app
from proxy.auth import cache_salt, hash_key
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.settings import ApiKeySettings, AuthSettings, Settings
from tests.e2e.conftest import MODEL
from tests.gateway_server import GatewayServer
from tests.upstream_server import REPLY_WORDS, UpstreamServer

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
SECRET = "salt-secret"
AUTH = AuthSettings(
    api_keys=[ApiKeySettings(tenant=t, sha256=hash_key(k)) for t, k in KEYS.items()], cache_salt_secret=SECRET
)


@pytest.fixture(scope="module")
def natives() -> Iterator[list[UpstreamServer]]:
    servers = [UpstreamServer(models=(MODEL,), responses_api=True).start() for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()


def gateway_over(*specs: WorkerSpec) -> GatewayServer:
    routing = RoutingSettings(policy="round_robin", health_interval_s=30)
    return GatewayServer(create_app(Settings(workers=list(specs), routing=routing, auth=AUTH))).start()


@pytest.fixture(scope="module")
def gateway(natives: list[UpstreamServer]) -> Iterator[GatewayServer]:
    server = gateway_over(*(WorkerSpec(url=u.url, models=[MODEL]) for u in natives))
    yield server
    server.stop()


@pytest.fixture
def sent(natives: list[UpstreamServer]) -> list[UpstreamServer]:
    for upstream in natives:
        upstream.requests.clear()
    return natives


def sdk(gateway: GatewayServer, tenant: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url, api_key=KEYS[tenant], max_retries=0, timeout=10)


def posts(upstream: UpstreamServer) -> list[dict[str, object]]:
    """The Responses requests the worker got (not the gateway's detection probe, an empty object)."""
    return [r.json for r in upstream.requests if r.method == "POST" and r.path == "/v1/responses" and r.json]


def test_bodies_pass_through_and_follow_ups_stay_with_their_worker(
    gateway: GatewayServer, sent: list[UpstreamServer]
) -> None:
    client = sdk(gateway)
    first = client.responses.create(model=MODEL, input="Hello", instructions="Be kind.", max_output_tokens=50)
    assert first.id.startswith("resp_up_") and first.output_text == "".join(REPLY_WORDS)
    home = next(u for u in sent if posts(u))
    assert posts(home) == [
        {"model": MODEL, "input": "Hello", "instructions": "Be kind.", "max_output_tokens": 50}
    ]
    ids = [first.id]
    for turn in range(3):  # round robin alone would alternate
        ids.append(
            client.responses.create(model=MODEL, input=f"turn {turn}", previous_response_id=ids[-1]).id
        )
    assert [p.get("previous_response_id") for p in posts(home)] == [None, *ids[:-1]]
    assert sum(len(posts(u)) for u in sent) == 4
    assert client.responses.retrieve(ids[-1]).previous_response_id is not None


def test_stream_events_pass_through_and_the_final_response_is_kept(
    gateway: GatewayServer, sent: list[UpstreamServer]
) -> None:
    client = sdk(gateway)
    with client.responses.stream(model=MODEL, input="Stream it") as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert final.output_text == "".join(REPLY_WORDS)
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_another_tenants_id_never_reaches_the_worker(
    gateway: GatewayServer, sent: list[UpstreamServer]
) -> None:
    kept = sdk(gateway, "alice").responses.create(model=MODEL, input="Alice's")
    before = sum(len(posts(u)) for u in sent)
    with pytest.raises(openai.NotFoundError):
        sdk(gateway, "bob").responses.create(model=MODEL, input="?", previous_response_id=kept.id)
    with pytest.raises(openai.NotFoundError):
        sdk(gateway, "bob").responses.retrieve(kept.id)
    assert sum(len(posts(u)) for u in sent) == before


def test_delete_removes_the_workers_copy_too(gateway: GatewayServer, sent: list[UpstreamServer]) -> None:
    client = sdk(gateway)
    kept = client.responses.create(model=MODEL, input="Delete me")
    client.responses.delete(kept.id)
    deletes = [r.path for u in sent for r in u.requests if r.method == "DELETE"]
    assert deletes == [f"/v1/responses/{kept.id}"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


def test_input_items_of_passed_through_responses(gateway: GatewayServer, sent: list[UpstreamServer]) -> None:
    client = sdk(gateway)
    first = client.responses.create(model=MODEL, input="One.")
    second = client.responses.create(model=MODEL, input="Two.", previous_response_id=first.id)
    listed = client.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in listed.data] == ["message"] * 3
    assert listed.data[1].id == first.output[0].id
    assert [listed.data[0].content[0].text, listed.data[2].content[0].text] == ["One.", "Two."]  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        sdk(gateway, "bob").responses.input_items.list(second.id)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_salting_workers_get_the_tenants_salt_in_passed_through_bodies(
    natives: list[UpstreamServer], kind: str
) -> None:
    """vLLM's and SGLang's `/v1/responses` take `cache_salt` as their chat endpoints do: one tenant's
    prefix KV is never reused for another's, and a client's own salt never reaches the worker."""
    natives[0].requests.clear()
    gateway = gateway_over(WorkerSpec(url=natives[0].url, kind=kind, models=[MODEL], responses_api=True))
    try:
        for tenant in KEYS:
            first = sdk(gateway, tenant).responses.create(
                model=MODEL, input="Hello", extra_body={"cache_salt": "forged"}
            )
            sdk(gateway, tenant).responses.create(model=MODEL, input="Again", previous_response_id=first.id)
    finally:
        gateway.stop()
    salts = [body.get("cache_salt") for body in posts(natives[0])]
    alice, bob = cache_salt(SECRET, "alice"), cache_salt(SECRET, "bob")
    assert salts == [alice, alice, bob, bob] and alice != bob
    assert not any(b"forged" in r.body for r in natives[0].requests)


def test_a_chat_only_worker_or_one_configured_off_is_served_by_translation(
    natives: list[UpstreamServer],
) -> None:
    chat_only = UpstreamServer(models=(MODEL,)).start()
    try:
        for specs in (
            [WorkerSpec(url=natives[0].url, models=[MODEL]), WorkerSpec(url=chat_only.url, models=[MODEL])],
            [WorkerSpec(url=natives[0].url, models=[MODEL], responses_api=False)],
        ):
            natives[0].requests.clear()
            chat_only.requests.clear()
            gateway = gateway_over(*specs)
            try:
                answer = sdk(gateway).responses.create(model=MODEL, input="Translate me")
            finally:
                gateway.stop()
            assert not answer.id.startswith("resp_up_")
            chats = [
                r for u in (natives[0], chat_only) for r in u.requests if r.path == "/v1/chat/completions"
            ]
            assert [json.loads(r.body)["messages"] for r in chats] == [
                [{"role": "user", "content": "Translate me"}]
            ]
            assert not posts(natives[0])
    finally:
        chat_only.stop()
