"""Prompt tokens for the routing trees: templates, tokenizer files, the byte fallback, salts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from adapters.base import EngineRequest
from adapters.cache_salt import with_cache_salt
from adapters.schema import ChatCompletionRequest, ChatMessage
from proxy.routing.prompts import PromptTokens
from proxy.routing.tokenizing import (
    ByteTokenizer,
    ChatRenderer,
    load_chat_template,
    load_tokenizer,
    render_chatml,
)


def word_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(["hello", "world", "system", "you", "are"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))
    return path


def chat(*contents: str, salt: str = "") -> EngineRequest:
    params = ChatCompletionRequest(
        model="m", messages=[ChatMessage(role="user", content=c) for c in contents]
    )
    return EngineRequest(
        operation="chat",
        params=params,
        raw_body=msgspec.json.encode(params),
        request_id="r",
        tenant_id="t",
        cache_salt=salt,
    )


def test_a_tokenizer_json_directory_is_loaded_without_torch(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(str(word_tokenizer(tmp_path)))
    assert tokenizer.kind == "tokenizer.json"
    assert tokenizer.encode_now("hello world") == [1, 2]


def test_a_missing_tokenizer_file_is_an_error_and_the_router_falls_back_to_bytes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not found"):
        load_tokenizer(str(tmp_path / "nope.json"))
    assert PromptTokens({"m": str(tmp_path / "nope.json")}, 16).kind("m") == "bytes"


@pytest.mark.parametrize(
    "text", ["", "hello world", "héllo wörld", "日本語のテキスト", "emoji 🙂 and \x00 nul", "ÿ\x7f\x80"]
)
def test_byte_arrays_hold_exactly_the_utf8_bytes(text: str) -> None:
    ids = ByteTokenizer().encode_array(text)
    assert ids.typecode == "I" and list(ids) == list(text.encode()) == ByteTokenizer().encode_now(text)


async def test_a_byte_routed_chat_is_the_utf8_of_its_rendered_prompt_with_the_salt_first() -> None:
    prompts = PromptTokens({}, 16)  # nothing configured, nothing discovered: UTF-8 bytes
    request = chat("héllo 🙂", "world")
    tokens, kind = await prompts.tokens(request, [])
    assert kind == "bytes" and list(tokens) == list(render_chatml(request.params.messages).encode())  # type: ignore[union-attr]
    salted, _ = await prompts.tokens(chat("héllo 🙂", "world", salt="tenant-a"), [])
    assert list(salted[1:]) == list(tokens) and salted[0] != tokens[0]


async def test_message_by_message_tokens_equal_whole_prompt_tokens(tmp_path: Path) -> None:
    prompts = PromptTokens({"m": str(word_tokenizer(tmp_path))}, 16)
    request = chat("you are hello", "world")
    tokens, kind = await prompts.tokens(request, [])
    whole = load_tokenizer(str(tmp_path)).encode_now(render_chatml(request.params.messages))  # type: ignore[union-attr]
    assert kind == "tokenizer.json" and list(tokens) == whole
    again, _ = await prompts.tokens(chat("you are hello", "world", "hello"), [])
    assert list(again[: len(tokens) - 2]) == list(tokens[:-2])  # the shared history is a shared prefix


async def test_the_tenant_salt_leads_the_tokens() -> None:
    prompts = PromptTokens({}, 16)
    plain, _ = await prompts.tokens(chat("hi"), [])
    salted_a, _ = await prompts.tokens(chat("hi", salt="a"), [])
    salted_b, _ = await prompts.tokens(chat("hi", salt="b"), [])
    assert list(salted_a[1:]) == list(plain) and salted_a[0] != salted_b[0]


def test_a_model_chat_template_next_to_the_tokenizer_is_used(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                "[assistant]"
            }
        )
    )
    renderer = ChatRenderer(load_chat_template(str(tmp_path / "tokenizer.json")))
    assert renderer.render([ChatMessage(role="user", content="hi")]) == "[user] hi\n[assistant]"
    assert renderer.segments([ChatMessage(role="user", content="hi")]) is None


def test_the_gateway_salt_replaces_a_clients_own() -> None:
    assert json.loads(with_cache_salt(b'{"model":"m"}', "s1")) == {"cache_salt": "s1", "model": "m"}
    assert json.loads(with_cache_salt(b"{ }", "s1")) == {"cache_salt": "s1"}
    forged = with_cache_salt(b'{"model":"m","cache_salt":"forged"}', "s1")
    assert json.loads(forged) == {"model": "m", "cache_salt": "s1"}
    assert with_cache_salt(b'{"model":"m"}', "") == b'{"model":"m"}'


async def test_a_burst_sharing_a_new_long_prompt_tokenizes_it_once(tmp_path: Path) -> None:
    prompts = PromptTokens({"m": str(word_tokenizer(tmp_path))}, 16)
    tokenizer = prompts._tokenizer("m")
    encoded: list[str] = []
    encode_many = tokenizer.encode_many  # type: ignore[union-attr]

    def counting(texts: list[str]) -> list[list[int]]:
        encoded.extend(texts)
        return encode_many(texts)

    tokenizer.encode_many = counting  # type: ignore[union-attr]
    system = "you are hello world " * 400  # long enough to be encoded on a thread
    results = await asyncio.gather(*(prompts.tokens(chat(system, f"hello {i}"), []) for i in range(8)))
    assert sum(1 for text in encoded if "you are hello world you are" in text) == 1
    first = list(results[0][0])
    assert all(list(tokens[: len(first) - 4]) == first[:-4] for tokens, _ in results)
