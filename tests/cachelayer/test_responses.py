"""The exact-match response cache: which requests it keys alike, which apart, and what it stores."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from cachelayer.disk import DiskTierConfig
from cachelayer.keys import KeySeed, bytes_key
from cachelayer.memory import MemoryTierConfig
from cachelayer.responses import ResponseCache, StoredResponse, canonical_request, is_deterministic
from cachelayer.tiers import StoreConfig, TieredStore

BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "temperature": 0,
    "max_tokens": 8,
}


def memory_cache(*, shared: bool = False) -> ResponseCache:
    return ResponseCache(TieredStore.from_config(StoreConfig()), share_across_tenants=shared)


def key(cache: ResponseCache, body: dict[str, Any] | bytes, **overrides: Any) -> bytes:
    options: dict[str, Any] = {
        "model": "m" if isinstance(body, bytes) else body.get("model", "m"),
        "operation": "chat",
        "streamed": False,
        "tenant_salt": "tenant-a",
        "label": None,
    }
    options.update(overrides)
    return cache.key(body if isinstance(body, bytes) else json.dumps(body).encode(), **options)


@pytest.mark.parametrize(
    ("temperature", "seed", "expected"),
    [
        (0, None, True),
        (0.0, None, True),
        (0.7, 3, True),
        (None, 0, True),
        (0.7, None, False),
        (None, None, False),
    ],
)
def test_only_greedy_or_seeded_requests_are_deterministic(
    temperature: float | None, seed: int | None, expected: bool
) -> None:
    assert is_deterministic(temperature, seed) is expected


def test_key_layout_is_pinned_and_documented() -> None:
    """The bytes of a key must not change between releases: L3 and Redis entries outlive processes."""
    digest = key(memory_cache(), BODY)
    assert digest.hex() == "ac3b839c9dfee17b22f273844fa19f27a8a852bd85bcbbccf734ab19580fb9bd"

    def lp(data: bytes) -> bytes:
        return len(data).to_bytes(4, "little") + data

    # The layout as `cachelayer.keys` and `cachelayer.responses` document it, rebuilt by hand.
    payload = b'{"max_tokens":8,"messages":[{"content":"hi","role":"user"}],"model":"m","temperature":0}'
    root = hashlib.sha256(
        b"radixgate/kv-seed/v1" + lp(b"m") + lp(b"") + lp(b"tenant-a") + (0).to_bytes(4, "little")
    ).digest()
    namespace = b"responses/v1/chat/json"
    assert digest == hashlib.sha256(b"radixgate/bytes/v1" + root + lp(namespace) + payload).digest()


def test_formatting_field_order_and_integral_floats_do_not_change_the_key() -> None:
    cache = memory_cache()
    spaced = b'{ "model" : "m",\n "messages": [{"role": "user", "content": "hi"}],\n'
    spaced += b' "temperature": 0.0, "max_tokens": 8 }'
    assert key(cache, spaced) == key(cache, BODY)
    reordered = {
        "max_tokens": 8.0,
        "temperature": 0.0,
        "messages": [{"content": "hi", "role": "user"}],
        "model": "m",
    }
    assert key(cache, reordered) == key(cache, BODY)
    assert canonical_request(json.dumps(reordered).encode(), streamed=False) == (
        b'{"max_tokens":8,"messages":[{"content":"hi","role":"user"}],"model":"m","temperature":0}'
    )
    assert key(cache, {**BODY, "top_p": 0.5}) != key(cache, {**BODY, "top_p": 0.50001})


def test_a_body_that_is_not_an_object_has_no_key() -> None:
    with pytest.raises(ValueError):
        canonical_request(b"[1, 2]", streamed=False)


def test_fields_that_cannot_change_the_answer_are_ignored() -> None:
    cache = memory_cache()
    labelled = {**BODY, "user": "alice", "metadata": {"run": "7"}, "store": True, "stream": False}
    assert key(cache, labelled) == key(cache, BODY)
    # stream_options shapes only streams: ignored for the JSON form, counted for the SSE form.
    with_options = {**BODY, "stream_options": {"include_usage": True}}
    assert key(cache, with_options) == key(cache, BODY)
    assert key(cache, with_options, streamed=True) != key(cache, BODY, streamed=True)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"messages": [{"role": "system", "content": "hi"}]},
        {"temperature": 0.5, "seed": 1},
        {"seed": 2},
        {"max_tokens": 9},
        {"top_p": 0.5},
        {"stop": ["\n"]},
        {"n": 2},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"tool_choice": "none"},
        {"response_format": {"type": "json_object"}},
        {"logprobs": True},
        {"top_logprobs": 2},
        {"logit_bias": {"50": 1}},
        {"vendor_extension": {"x": 1}},
        {"model": "other"},
    ],
)
def test_every_other_parameter_changes_the_key(change: dict[str, Any]) -> None:
    cache = memory_cache()
    assert key(cache, {**BODY, **change}) != key(cache, BODY)


def test_form_operation_label_and_tenant_separate_entries() -> None:
    cache = memory_cache()
    base = key(cache, BODY)
    assert key(cache, BODY, streamed=True) != base
    assert key(cache, BODY, operation="text_completion") != base
    assert key(cache, BODY, label="v1") != base
    assert key(cache, BODY, label="v1") != key(cache, BODY, label="v2")
    assert key(cache, BODY, tenant_salt="tenant-b") != base


def test_tenants_share_entries_only_when_configured() -> None:
    shared = memory_cache(shared=True)
    assert key(shared, BODY, tenant_salt="tenant-a") == key(shared, BODY, tenant_salt="tenant-b")


def test_json_and_stream_answers_round_trip_exactly() -> None:
    cache = memory_cache()
    body = b'{"id":"chatcmpl-1","choices":[{"index":0,"finish_reason":"stop"}]}'
    chunks = [b'{"id":"c","choices":[{"delta":{"content":"a"}}]}', b'{"id":"c","choices":[]}']
    cache.put(b"j" * 32, StoredResponse.json_body(body, 3, 5))
    cache.put(b"s" * 32, StoredResponse.stream(chunks, 3, 5))
    stored = cache.get(b"j" * 32)
    assert stored is not None and not stored.streamed
    assert (stored.body, stored.prompt_tokens, stored.completion_tokens) == (body, 3, 5)
    streamed = cache.get(b"s" * 32)
    assert streamed is not None and streamed.streamed and streamed.chunks == chunks
    assert cache.get(b"x" * 32) is None


def test_an_entry_that_does_not_decode_is_a_miss_and_is_dropped() -> None:
    cache = memory_cache()
    cache.store.put(b"k" * 32, b"\x00not msgpack of a stored response")
    assert cache.get(b"k" * 32) is None
    assert cache.store.get(b"k" * 32) is None


def test_a_store_with_a_disk_tier_is_blocking(tmp_path: Path) -> None:
    assert memory_cache().blocking is False
    store = TieredStore.from_config(StoreConfig(l3=DiskTierConfig(directory=tmp_path)))
    cache = ResponseCache(store)
    assert cache.blocking is True
    cache.close()


def test_answers_written_through_to_disk_survive_a_restart(tmp_path: Path) -> None:
    config = StoreConfig(
        l1=MemoryTierConfig(name="l1", capacity_bytes=1 << 20),
        l2=None,
        l3=DiskTierConfig(directory=tmp_path, fsync=False),
        write_policy="write_through",
    )
    first = ResponseCache(TieredStore.from_config(config))
    entry_key = key(first, BODY)
    first.put(entry_key, StoredResponse.stream([b'{"a":1}', b'{"b":2}'], 1, 2))
    first.close()
    second = ResponseCache(TieredStore.from_config(config))
    stored = second.get(entry_key)
    second.close()
    assert stored is not None and stored.chunks == [b'{"a":1}', b'{"b":2}']
    assert second.stats().tiers[1].hits == 1  # found on disk, not in the new process's memory


def test_the_kept_hash_state_gives_the_documented_key_for_every_scope() -> None:
    """`ResponseCache.key` reuses a hash state per scope; it equals `bytes_key` over the canonical bytes."""
    cache = memory_cache()
    raw = json.dumps(BODY).encode()
    for salt, label in (("tenant-a", None), ("tenant-b", None), ("tenant-a", "v1")):
        for _ in range(2):  # the second call uses the kept state
            namespace = "responses/v1/chat/json" + (f"/{label}" if label else "")
            expected = bytes_key(
                canonical_request(raw, streamed=False),
                seed=KeySeed(model_id=BODY["model"], tokenizer_hash="", tenant_salt=salt),
                namespace=namespace,
            )
            got = cache.key(
                raw, model=BODY["model"], operation="chat", streamed=False, tenant_salt=salt, label=label
            )
            assert got == expected
