"""Grammars from requests (llguidance on SmolLM2's vocabulary), masks per row, prompts with tools."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adapters.errors import InvalidRequest
from adapters.local.grammar import GrammarCompiler, mask_rows
from adapters.local.loader import LoadedModel
from adapters.local.prepare import EngineLimits, prepare
from adapters.local.tool_calls import tool_plan
from adapters.schema import ChatCompletionRequest, ChatMessage

LIMITS = EngineLimits(vocab_size=49152, max_context=1024, pool_tokens=4096, page_size=16, max_n=4)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def compiler(loaded: LoadedModel) -> GrammarCompiler:
    return GrammarCompiler(loaded.tokenizer, loaded.spec.vocab_size)


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[ChatMessage(role="user", content="hi")], **fields)


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def accepts(
    compiler: GrammarCompiler, loaded: LoadedModel, request: ChatCompletionRequest, text: str
) -> bool:
    grammar = compiler.compile(request, tool_plan(request))
    assert grammar is not None
    state = grammar.start()
    ids = loaded.tokenizer.encode(text)
    return state.matcher.consume_tokens(ids) and state.matcher.is_accepting()


def test_plain_text_needs_no_grammar(compiler: GrammarCompiler) -> None:
    assert compiler.compile(chat(), None) is None
    assert compiler.compile(chat(response_format={"type": "text"}), None) is None


def test_the_vocabulary_is_built_by_the_first_grammar_only(loaded: LoadedModel) -> None:
    """Deployments without structured outputs never pay the vocabulary's memory."""
    fresh = GrammarCompiler(loaded.tokenizer, loaded.spec.vocab_size)
    assert fresh.compile(chat(), None) is None
    assert not fresh.built
    assert fresh.compile(chat(response_format={"type": "json_object"}), None) is not None
    assert fresh.built


def test_a_schema_admits_its_documents_and_nothing_else(
    compiler: GrammarCompiler, loaded: LoadedModel
) -> None:
    request = chat(response_format=schema_format(PERSON))
    assert accepts(compiler, loaded, request, '{"name": "Ann", "age": 3}')
    assert not accepts(compiler, loaded, request, '{"name": "Ann"}')
    assert not accepts(compiler, loaded, request, '{"name": "Ann", "age": "3"}')
    assert accepts(compiler, loaded, chat(response_format={"type": "json_object"}), '{"x": [1, null]}')


def test_auto_admits_plain_text_or_a_call(compiler: GrammarCompiler, loaded: LoadedModel) -> None:
    request = chat(tools=[WEATHER])
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    assert accepts(compiler, loaded, request, call)
    assert accepts(compiler, loaded, request, "It is sunny.")
    assert not accepts(compiler, loaded, request, '<tool_call>{"name": "other", "arguments": {}}</tool_call>')
    assert not accepts(compiler, loaded, chat(tools=[WEATHER], tool_choice="required"), "It is sunny.")


@pytest.mark.parametrize(
    ("response_format", "tools"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, None),
        (schema_format({"type": "object", "if": {"required": ["a"]}}), None),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}}, None),
        ({"type": "yaml"}, None),
        (None, [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "if": {}}}}]),
    ],
)
def test_unsupported_schemas_are_400(
    compiler: GrammarCompiler, response_format: dict[str, Any] | None, tools: list[dict[str, Any]] | None
) -> None:
    request = chat(response_format=response_format, tools=tools)
    with pytest.raises(InvalidRequest) as raised:
        compiler.compile(request, tool_plan(request))
    assert raised.value.status == 400
    assert raised.value.param == ("tools" if tools else "response_format")


def test_masks_touch_only_constrained_rows(compiler: GrammarCompiler, loaded: LoadedModel) -> None:
    grammar = compiler.compile(chat(response_format=schema_format(PERSON)), None)
    assert grammar is not None
    logits = torch.randn(3, loaded.spec.vocab_size)
    free = logits[1].clone()
    mask_rows(logits, [grammar.start(), None, grammar.start()])
    assert torch.equal(logits[1], free)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == torch.isfinite(logits[2]).nonzero().flatten().tolist()
    assert [loaded.tokenizer.piece(t) for t in allowed] == ['{"']  # the schema's forced opening


def test_a_finished_or_broken_grammar_allows_only_eos(compiler: GrammarCompiler, loaded: LoadedModel) -> None:
    grammar = compiler.compile(chat(response_format={"type": "json_object"}), None)
    assert grammar is not None
    done, broken = grammar.start(), grammar.start()
    for token in loaded.tokenizer.encode("{}"):
        done.advance(token)
    broken.advance(loaded.tokenizer.encode("x")[0])
    logits = torch.zeros(2, loaded.spec.vocab_size)
    mask_rows(logits, [done, broken])
    eos = loaded.tokenizer.eos_id
    for row in logits:
        assert torch.isfinite(row).nonzero().flatten().tolist() == [eos]


def test_tools_and_their_history_are_rendered_for_a_template_without_tools(loaded: LoadedModel) -> None:
    assert not loaded.template.reads_tools  # SmolLM2's template ignores `tools`
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    request = ChatCompletionRequest(
        model="m",
        tools=[WEATHER],
        messages=[
            ChatMessage(role="user", content="Weather in Oslo?"),
            ChatMessage(role="assistant", content=None, tool_calls=[call]),
            ChatMessage(role="tool", content="12 C, rain", tool_call_id="c1"),
        ],
    )
    prepared = prepare(request, loaded.tokenizer, loaded.template, LIMITS)
    prompt = loaded.template.render(request.messages, tools=prepared.tools)
    assert prepared.groups[0].prompt == loaded.tokenizer.encode(prompt)
    assert '"name": "get_weather"' in prompt.split("<|im_start|>user")[0]  # listed in the system message
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' in prompt
    assert "<|im_start|>tool\n<tool_response>12 C, rain</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
