"""From an OpenAI request to token ids and validated sampling settings, or a 400 saying why.

Ranges follow OpenAI (temperature 0..2, top_p 0..1, penalties -2..2, top_logprobs 0..20) and
vLLM's extensions (top_k, min_p, repetition_penalty, stop_token_ids). A prompt that cannot fit
the model's context, or the KV pool, is refused up front rather than failing mid-generation.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.errors import InvalidRequest
from adapters.local.carry import carry_spans
from adapters.local.chat_template import ChatTemplate
from adapters.local.sampling import SamplingParams
from adapters.local.sequence import PromptGroup
from adapters.local.tokenizer import TextTokenizer
from adapters.local.tool_calls import ToolPlan, tool_plan
from adapters.schema import ChatCompletionRequest, CompletionRequest, GenerationRequest

MAX_TOP_LOGPROBS = 20


@dataclass(slots=True, frozen=True)
class EngineLimits:
    """What one request may ask of this engine."""

    vocab_size: int
    max_context: int
    pool_tokens: int
    page_size: int
    max_n: int
    max_beam_width: int = 1
    """Most beams one request may ask for (`n` with `use_beam_search`)."""
    window_pages: int = 0
    """Most pages one windowed sequence holds (sinks, window and the page being filled); 0: no window."""
    window_size: int = 0
    """The window's tokens (W); a chat's carried spans may take up to half of it each."""


@dataclass(slots=True)
class PreparedRequest:
    """A request in the engine's terms."""

    groups: list[PromptGroup]
    params: SamplingParams
    prompt_tokens: int
    echo: list[str] | None
    """Completions with `echo`: each prompt's text, which its choices start with."""
    tools: ToolPlan | None = None
    """Chat with tools the model may call now (listed in its prompt)."""


def prepare(
    params: GenerationRequest,
    tokenizer: TextTokenizer,
    template: ChatTemplate,
    limits: EngineLimits,
    *,
    windowed: bool = False,
) -> PreparedRequest:
    """Tokenize the prompt(s) and validate every sampling field; raises InvalidRequest.

    `windowed`: the request attends with a sliding window (`limits.window_pages` must be set), so
    its prompt and completion may run past the model's context; its pages, not its length, must
    fit the pool, and without `max_tokens` it completes at most `max_context` tokens."""
    n = params.n
    if not 1 <= n <= limits.max_n:
        raise InvalidRequest(f"n must be between 1 and {limits.max_n}", param="n")
    tools = None
    if isinstance(params, ChatCompletionRequest):
        tools = tool_plan(params)
        prompts = [_chat_prompt(params, tokenizer, template, tools)]
        echo = None
    else:
        prompts = _completion_prompts(params, tokenizer, limits.vocab_size)
        echo = [tokenizer.decode(p) for p in prompts] if params.echo else None
    groups = [PromptGroup(prompt=p, first_index=i * n, n=n) for i, p in enumerate(prompts)]
    if windowed:
        if isinstance(params, ChatCompletionRequest):
            groups[0].carry = carry_spans(
                params.messages, prompts[0], tokenizer, template, limits.window_size
            )
        return _windowed(params, prompts, groups, echo, limits)
    # Forks copy the prompt's partial last page, so n choices need up to n-1 extra pages.
    room = min(limits.max_context, limits.pool_tokens - (n - 1) * limits.page_size)
    longest = max(len(p) for p in prompts)
    if longest >= room:
        raise InvalidRequest(
            f"this model's maximum context length is {room} tokens, but the prompt has {longest} tokens",
            param="messages" if isinstance(params, ChatCompletionRequest) else "prompt",
            code="context_length_exceeded",
        )
    limit = params.token_limit
    if limit is not None and limit < 1:
        raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
    if limit is not None and longest + limit > room:
        raise InvalidRequest(
            f"this model's maximum context length is {room} tokens; the prompt ({longest} tokens) plus "
            f"max_tokens ({limit}) exceeds it",
            param="max_tokens",
            code="context_length_exceeded",
        )
    sampling = _sampling(params, limit if limit is not None else room - longest, limits)
    return PreparedRequest(
        groups=groups, params=sampling, prompt_tokens=sum(len(p) for p in prompts), echo=echo, tools=tools
    )


def _windowed(
    params: GenerationRequest,
    prompts: list[list[int]],
    groups: list[PromptGroup],
    echo: list[str] | None,
    limits: EngineLimits,
) -> PreparedRequest:
    """`prepare`'s limits for a windowed request: bounded pages instead of a bounded length."""
    pages = limits.window_pages
    carry = groups[0].carry
    if carry is not None:  # the head and the pinned turn's pages (one more where it straddles), anchored
        pages += 2 * (
            -(-carry.head // limits.page_size) + -(-(carry.pin_end - carry.pin_start) // limits.page_size) + 1
        )
    if params.n * pages * limits.page_size > limits.pool_tokens:
        raise InvalidRequest(
            f"{params.n} windowed choices need {params.n * pages} KV pages; the pool has "
            f"{limits.pool_tokens // limits.page_size}",
            param="n",
        )
    limit = params.token_limit
    if limit is not None and limit < 1:
        raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
    sampling = _sampling(params, limit if limit is not None else limits.max_context, limits)
    return PreparedRequest(
        groups=groups, params=sampling, prompt_tokens=sum(len(p) for p in prompts), echo=echo
    )


def _chat_prompt(
    params: ChatCompletionRequest, tokenizer: TextTokenizer, template: ChatTemplate, tools: ToolPlan | None
) -> list[int]:
    if not params.messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    return tokenizer.encode(template.render(params.messages, tools=tools))


def _completion_prompts(params: CompletionRequest, tokenizer: TextTokenizer, vocab: int) -> list[list[int]]:
    if params.suffix is not None:
        raise InvalidRequest("suffix is not supported by the local engine", param="suffix")
    if params.echo and params.logprobs is not None:
        raise InvalidRequest("echo with logprobs is not supported by the local engine", param="echo")
    raw = params.prompt
    items: list[str | list[int]]
    if isinstance(raw, str):
        items = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        items = [[int(x) for x in raw]]  # type: ignore[arg-type]
    else:
        items = list(raw)  # type: ignore[arg-type]
    prompts = []
    for item in items:
        ids = tokenizer.encode(item, add_bos=True) if isinstance(item, str) else list(item)
        if not ids:
            raise InvalidRequest("the prompt must contain at least one token", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequest(f"prompt token ids must lie in [0, {vocab})", param="prompt")
        prompts.append(ids)
    if not prompts:
        raise InvalidRequest("the prompt must not be empty", param="prompt")
    return prompts


def _check(value: float | None, low: float, high: float, name: str, *, low_open: bool = False) -> None:
    if value is None:
        return
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise InvalidRequest(f"{name} must be in {bracket}{low}, {high}], got {value}", param=name)


def _sampling(params: GenerationRequest, max_tokens: int, limits: EngineLimits) -> SamplingParams:
    _check(params.temperature, 0.0, 2.0, "temperature")
    _check(params.top_p, 0.0, 1.0, "top_p", low_open=True)
    _check(params.min_p, 0.0, 1.0, "min_p")
    _check(params.frequency_penalty, -2.0, 2.0, "frequency_penalty")
    _check(params.presence_penalty, -2.0, 2.0, "presence_penalty")
    _check(params.repetition_penalty, 0.0, 2.0, "repetition_penalty", low_open=True)
    top_k = params.top_k if params.top_k is not None else 0
    if top_k < -1:
        raise InvalidRequest("top_k must be -1 (off), 0 (off) or a positive count", param="top_k")
    stop = (params.stop,) if isinstance(params.stop, str) else tuple(params.stop or ())
    for token in params.stop_token_ids or ():
        if not 0 <= token < limits.vocab_size:
            raise InvalidRequest(
                f"stop_token_ids must lie in [0, {limits.vocab_size})", param="stop_token_ids"
            )
    bias = []
    for key, value in (params.logit_bias or {}).items():
        if not key.lstrip("-").isdigit() or not 0 <= int(key) < limits.vocab_size:
            raise InvalidRequest(
                f"logit_bias key {key!r} is not a token id of this model", param="logit_bias"
            )
        _check(value, -100.0, 100.0, "logit_bias")
        bias.append((int(key), float(value)))
    want, top = _logprob_request(params)
    if params.use_beam_search:
        _check_beam_search(params, stop, bias, want, limits)
    elif params.length_penalty is not None or params.early_stopping is not None:
        name = "length_penalty" if params.length_penalty is not None else "early_stopping"
        raise InvalidRequest(f"{name} applies to beam search only (use_beam_search)", param=name)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if params.temperature is None else params.temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        top_k=max(top_k, 0),
        min_p=params.min_p or 0.0,
        frequency_penalty=params.frequency_penalty or 0.0,
        presence_penalty=params.presence_penalty or 0.0,
        repetition_penalty=1.0 if params.repetition_penalty is None else params.repetition_penalty,
        seed=params.seed,
        stop=stop,
        stop_token_ids=frozenset(params.stop_token_ids or ()),
        logprobs=want,
        top_logprobs=top,
        logit_bias=tuple(bias),
        beam_search=params.use_beam_search,
        length_penalty=1.0 if params.length_penalty is None else params.length_penalty,
        early_stopping=bool(params.early_stopping),
    )


def _check_beam_search(
    params: GenerationRequest,
    stop: tuple[str, ...],
    bias: list[tuple[int, float]],
    logprobs: bool,
    limits: EngineLimits,
) -> None:
    """Beam search ranks whole hypotheses by the model's log-probabilities: it has no stream, and no
    truncation, penalty, bias, stop string or logprobs to apply to them."""
    if params.n > limits.max_beam_width:
        raise InvalidRequest(
            f"n (the beam width) must be at most {limits.max_beam_width} ([speculative] beam_width)",
            param="n",
        )
    _check(params.length_penalty, -10.0, 10.0, "length_penalty")
    refused = {
        "stream": params.stream,
        "stop": bool(stop),
        "logit_bias": bool(bias),
        "logprobs": logprobs,
        "top_p": params.top_p not in (None, 1.0),
        "top_k": params.top_k not in (None, 0, -1),
        "min_p": bool(params.min_p),
        "frequency_penalty": bool(params.frequency_penalty),
        "presence_penalty": bool(params.presence_penalty),
        "repetition_penalty": params.repetition_penalty not in (None, 1.0),
        "seed": params.seed is not None,
    }
    for name, present in refused.items():
        if present:
            raise InvalidRequest(f"{name} is not supported with use_beam_search", param=name)


def _logprob_request(params: GenerationRequest) -> tuple[bool, int]:
    if isinstance(params, ChatCompletionRequest):
        top = params.top_logprobs or 0
        if params.top_logprobs is not None and not params.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs")
        return bool(params.logprobs), top
    if params.logprobs is None:
        return False, 0
    if not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="logprobs")
    return True, params.logprobs
