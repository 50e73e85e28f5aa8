"""Constrained decoding for the embedded engine: JSON answers and tool calls, on llguidance.

Why llguidance (checked with pip against torch==2.13.0 on the CPU dev host, December 2026): its
wheel has no runtime dependency at all (no torch, no CUDA, no triton) and ships type stubs. xgrammar
0.2.8 depends on torch and transformers and pulls triton, a GPU compiler; outlines-core 0.2.14 has no
dependencies either but compiles each schema to a regex automaton up front (no recursive schemas,
build time that grows with the schema). llguidance is the grammar engine vLLM, SGLang and
llama.cpp use: an Earley parser over a lexer, JSON Schema and Lark grammars, a token mask in tens
of microseconds.

One `OutputGrammar` per request, compiled on the event loop so that a schema the library refuses is
a 400 before any work; one `GrammarState` per choice, a copy of the request's matcher. The engine
thread calls `mask_rows` once a step where logits become tokens: each constrained row gets -inf
outside its grammar's allowed tokens (llguidance's mask of one byte per token, applied by numpy),
free rows of the same step are untouched; then each sampled token is fed back with
`GrammarState.advance`. A finished grammar allows only EOS, so the model's own next token ends the
choice with `stop`.

Logprobs under a grammar are those of the distribution the token was drawn from: the model's,
renormalised over the allowed tokens (a forced token has logprob 0); refused ones are never listed.

JSON is written compact with `json.dumps`'s separators (`", "`, `": "`): flexible whitespace lets a
small model emit blank lines until `max_tokens`.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import llguidance
import numpy as np
import torch

from adapters.errors import InvalidRequest
from adapters.local.tokenizer import TextTokenizer
from adapters.local.tool_calls import CALL_SUFFIX, ToolPlan, call_prefix
from adapters.schema import ChatCompletionRequest

logger = logging.getLogger(__name__)

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options for every schema (set over the schema's own `x-guidance`)."""
ANY_OBJECT: dict[str, Any] = {"type": "object"}
"""`response_format` `json_object`: any JSON object."""
_FREE_TEXT = r"/[^<][\s\S]*/"  # `auto`'s plain answer: anything that does not open a call


class _Vocabulary:
    """What `llguidance.TokenizerWrapper` reads: each token's bytes, EOS, the special ids, encode."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.special.bos_id
        self.tokens = tokenizer.token_bytes
        self.special_token_ids = sorted(tokenizer.special_ids)

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text)


class GrammarCompiler:
    """Compiles requests' grammars against the model's vocabulary in llguidance's terms.

    The vocabulary is built at the first request that needs a grammar, not at start: it holds
    ~20 MiB of resident memory (SmolLM2's 49,152 tokens, measured with `/proc/self/smaps_rollup`
    around its construction) that a deployment without structured outputs or tools never uses. It
    takes ~0.2 s once (AMD EPYC Zen 3, 2026-12-07), in a worker thread when the engine asks for it
    (`build_vocabulary`), else within the first `compile`."""

    def __init__(self, tokenizer: TextTokenizer, vocab_size: int) -> None:
        if tokenizer.eos_id is None:
            raise ValueError("constrained decoding needs the model's EOS token")
        self.eos_id = tokenizer.eos_id
        self._source = tokenizer
        self._vocab_size = vocab_size
        self._vocabulary: llguidance.LLTokenizer | None = None
        self._build_lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether the vocabulary has been built (by `build_vocabulary` or a first grammar)."""
        return self._vocabulary is not None

    def compile(self, params: ChatCompletionRequest, tools: ToolPlan | None) -> OutputGrammar | None:
        """The grammar a chat request's answer must follow; None when it is free text."""
        answer = _answer_schema(params.response_format)
        if answer is None and tools is None:
            return None
        lark = _lark(answer, tools)
        matcher = llguidance.LLMatcher(self._llg_tokenizer(), lark, log_level=0)
        if matcher.is_error():
            param = "response_format" if answer is not None and tools is None else "tools"
            raise InvalidRequest(f"unsupported schema: {matcher.get_error()}", param=param)
        return OutputGrammar(matcher, self.eos_id)

    def may_compile(self, params: ChatCompletionRequest) -> bool:
        """Whether `compile` may need the vocabulary for this request: an answer format other than
        text, or tools (checked loosely; `compile` validates)."""
        kind = (params.response_format or {}).get("type", "text")
        return kind != "text" or bool(params.tools)

    def build_vocabulary(self) -> None:
        """Build the vocabulary now (the engine does it off its event loop before a first grammar)."""
        self._llg_tokenizer()

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._build_lock:
            if self._vocabulary is None:
                self._vocabulary = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_Vocabulary(self._source)), n_vocab=self._vocab_size
                )
            return self._vocabulary


def _answer_schema(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        spec = (response_format or {}).get("json_schema")
        schema = spec.get("schema", ANY_OBJECT) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "response_format.json_schema.schema must be a JSON schema object", param="response_format"
            )
        return schema
    raise InvalidRequest(
        f"response_format.type must be text, json_object or json_schema, got {kind!r}",
        param="response_format",
    )


def _json_rule(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def _lark(answer: dict[str, Any] | None, tools: ToolPlan | None) -> str:
    """One Lark grammar: `start` is a JSON answer, calls, or either (plain text or JSON, or calls).
    Calls are one, or with `parallel_tool_calls` one or more back to back, each any callable function's."""
    rules: list[str] = []
    choices: list[str] = []
    functions = tools.callable if tools is not None else ()
    for i, function in enumerate(functions):
        rules.append(f"call_{i}: {json.dumps(call_prefix(function.name))} args_{i} {json.dumps(CALL_SUFFIX)}")
        rules.append(f"args_{i}: {_json_rule(function.parameters)}")
    if tools is not None:
        choices.append("calls")
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(functions))))
        rules.append("calls: call+" if tools.parallel else "calls: call")
    if tools is None or not tools.required:
        choices.append("answer")
        rules.append(f"answer: {_json_rule(answer)}" if answer is not None else "answer: FREE_TEXT")
        if answer is None:
            rules.append(f"FREE_TEXT: {_FREE_TEXT}")
    return "\n".join([f"start: {' | '.join(choices)}", *rules]) + "\n"


class OutputGrammar:
    """A request's compiled grammar; `start` gives each choice its own state."""

    __slots__ = ("_eos_id", "_matcher")

    def __init__(self, matcher: llguidance.LLMatcher, eos_id: int) -> None:
        self._matcher = matcher
        self._eos_id = eos_id

    def start(self) -> GrammarState:
        return GrammarState(self._matcher.deep_copy(), self._eos_id)


class GrammarState:
    """Where one choice stands in its grammar."""

    __slots__ = ("eos_id", "matcher")

    def __init__(self, matcher: llguidance.LLMatcher, eos_id: int) -> None:
        self.matcher = matcher
        self.eos_id = eos_id

    def advance(self, token: int) -> None:
        """Feed the sampled token. A token the grammar refuses (none can pass the mask) leaves the
        matcher in its error state, whose mask allows only EOS: the choice ends rather than wanders."""
        if not self.matcher.consume_token(token) and token != self.eos_id:
            logger.warning("grammar refused token %d: %s", token, self.matcher.get_error())


def mask_rows(logits: torch.Tensor, states: list[GrammarState | None]) -> None:
    """Set to -inf, in place, every token that row i's grammar (`states[i]`) does not allow now;
    rows without a grammar are left as they are. `logits` are the step's float32 logits (the model's
    `forward` returns them so)."""
    rows = [(i, state) for i, state in enumerate(states) if state is not None]
    if not rows:
        return
    vocab = logits.shape[1]
    values = logits.numpy()  # the same memory: numpy's fill runs on this thread alone
    for row, state in rows:
        # llguidance's byte-per-token mask (0: refused) needs no unpacking; numpy fills the row without
        # torch's thread pool, whose workers wait for busy cores (benchmarks/results/structured_outputs.md).
        allowed = np.frombuffer(state.matcher.compute_logit_bias(), dtype=np.uint8)[:vocab]
        np.copyto(values[row], -np.inf, where=allowed == 0)
