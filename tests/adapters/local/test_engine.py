"""`LocalEngine` through the `Engine` protocol: OpenAI bodies, chunks, usage, errors, cancellation."""

from __future__ import annotations

import asyncio
import json

import pytest

from adapters.errors import InvalidRequest
from adapters.local import LocalEngine
from adapters.schema import StreamOptions, probe_response
from tests.adapters.local.conftest import chat, collect_stream, completion, streamed_text

pytestmark = pytest.mark.slow


async def test_chat_answers_paris(engine: LocalEngine) -> None:
    result = await engine.complete(chat("What is the capital of France?", temperature=0, max_tokens=24))
    body = json.loads(result.body)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == engine.model_id
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (
        result.usage is not None
        and result.usage.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
    )
    assert result.finish_reasons == ["stop"] and result.response_id == body["id"]


async def test_streaming_matches_non_streaming(engine: LocalEngine) -> None:
    question = "Give two reasons to learn Python."
    whole = json.loads((await engine.complete(chat(question, temperature=0, max_tokens=40))).body)
    options = StreamOptions(include_usage=True)
    chunks = await collect_stream(
        engine, chat(question, temperature=0, max_tokens=40, stream=True, stream_options=options)
    )
    assert streamed_text(chunks) == whole["choices"][0]["message"]["content"]
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert (
        chunks[-1]["choices"] == []
        and chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    )
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == [whole["choices"][0]["finish_reason"]]


async def test_stream_without_usage_option_has_no_usage_key(engine: LocalEngine) -> None:
    chunks = await collect_stream(engine, completion("The sky is", temperature=0, max_tokens=5, stream=True))
    assert all("usage" not in c for c in chunks)
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_completions_stop_strings_and_length(engine: LocalEngine) -> None:
    body = json.loads(
        (await engine.complete(completion("1, 2, 3,", temperature=0, max_tokens=30, stop=[" 6"]))).body
    )
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == " 4, 5," and body["choices"][0]["finish_reason"] == "stop"
    short = json.loads((await engine.complete(completion("1, 2, 3,", temperature=0, max_tokens=3))).body)
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 3


async def test_echo_and_several_prompts(engine: LocalEngine) -> None:
    result = await engine.complete(
        completion(["Red, green,", "A, B,"], temperature=0, max_tokens=4, echo=True, n=2)
    )
    choices = json.loads(result.body)["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert choices[0]["text"].startswith("Red, green,") and choices[2]["text"].startswith("A, B,")
    assert choices[0]["text"] == choices[1]["text"]


async def test_seeded_sampling_repeats(engine: LocalEngine) -> None:
    async def sample(seed: int) -> list[str]:
        request = chat("Invent a name for a cat.", temperature=1.0, top_p=0.95, seed=seed, max_tokens=16, n=2)
        return [c["message"]["content"] for c in json.loads((await engine.complete(request)).body)["choices"]]

    first = await sample(7)
    assert first == await sample(7)
    assert first[0] != first[1]
    assert first != await sample(8)


async def test_chat_logprobs_shape(engine: LocalEngine) -> None:
    body = json.loads(
        (
            await engine.complete(
                chat("Say yes.", temperature=0, max_tokens=3, logprobs=True, top_logprobs=2)
            )
        ).body
    )
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert entry["logprob"] <= 0 and bytes(entry["bytes"]).decode("utf-8", "replace") == entry["token"]
        assert len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][0]["logprob"] >= entry["logprob"]


async def test_completion_logprobs_shape(engine: LocalEngine) -> None:
    body = json.loads(
        (await engine.complete(completion("Hello", temperature=0, max_tokens=4, logprobs=1))).body
    )
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["text_offset"]) == 4
    assert "".join(logprobs["tokens"]) == body["choices"][0]["text"]
    assert logprobs["text_offset"][0] == 0 and all(len(t) == 1 for t in logprobs["top_logprobs"])


async def test_repeated_prompt_reports_cached_tokens(engine: LocalEngine) -> None:
    request = chat("Describe the ocean in a long sentence. " * 6, temperature=0, max_tokens=2)
    await engine.complete(request)
    usage = probe_response((await engine.complete(request)).body).usage
    assert usage is not None and usage.cached_tokens is not None and usage.cached_tokens >= 64


async def test_invalid_values_raise_before_any_work(engine: LocalEngine) -> None:
    with pytest.raises(InvalidRequest) as raised:
        await engine.complete(chat("hi", temperature=5))
    assert raised.value.status == 400 and raised.value.param == "temperature"
    stream = engine.stream(chat("hi", top_p=0.0, stream=True))
    with pytest.raises(InvalidRequest):
        await stream.__anext__()


async def test_closing_a_stream_frees_its_pages(engine: LocalEngine) -> None:
    baseline = engine.stats()
    assert baseline is not None and baseline.active_pages == 0
    stream = engine.stream(chat("Write a very long story about a dragon.", max_tokens=400, stream=True))
    received = [await stream.__anext__() for _ in range(4)]
    assert len(received) == 4
    busy = engine.stats()
    assert busy is not None and busy.active_pages > 0
    await stream.aclose()
    for _ in range(500):
        stats = engine.stats()
        assert stats is not None
        if stats.active_pages == 0 and stats.running == 0:
            break
        await asyncio.sleep(0.01)
    assert stats.active_pages == 0 and stats.running == 0
    assert stats.pool_pages_free + stats.cached_tokens // stats.page_size == stats.pool_pages_total
