"""The load generator: streams chat requests at a router (or straight at workers) and times them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import msgspec

from benchmarks.routing.workload import Conversation, Request

MODEL = "sim-model"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta = msgspec.field(default_factory=_Delta)


class _Usage(msgspec.Struct):
    completion_tokens: int = 0


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None


class _Answer(msgspec.Struct):
    usage: _Usage = msgspec.field(default_factory=_Usage)


_chunk = msgspec.json.Decoder(_Chunk)
_answer = msgspec.json.Decoder(_Answer)
_JSON = {"content-type": "application/json"}


@dataclass(slots=True)
class Outcome:
    """One request's timings; `error` is set when it failed."""

    ttft_s: float | None = None
    """Seconds to the first streamed content (None for a non-streamed request)."""
    latency_s: float = 0.0
    output_tokens: int = 0
    text: str = ""
    error: str | None = None
    turn: int | None = None
    """The turn of a multi-turn conversation (None for the bulk workloads)."""
    started_s: float = 0.0
    """When the request was sent, in seconds from the start of the run."""


@dataclass(slots=True)
class RunResult:
    """Every outcome of one run and its wall time."""

    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def failures(self) -> int:
        return sum(1 for o in self.outcomes if o.error is not None)

    @property
    def output_tokens(self) -> int:
        return sum(o.output_tokens for o in self.outcomes)

    @property
    def throughput(self) -> float:
        """Output tokens per wall second."""
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    def ttft_percentile(self, q: float) -> float | None:
        return _percentile([o.ttft_s for o in self.outcomes if o.error is None and o.ttft_s is not None], q)

    def latency_percentile(self, q: float) -> float | None:
        return _percentile([o.latency_s for o in self.outcomes if o.error is None], q)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values.sort()
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def chat_body(request: Request, user: str | None, *, stream: bool) -> bytes:
    """The request body, encoded once (before the clock starts, for the bulk workloads)."""
    body: dict[str, object] = {"model": MODEL, "messages": request.messages, "max_tokens": request.max_tokens}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    if user is not None:
        body["user"] = user
    return msgspec.json.encode(body)


async def complete_chat(client: httpx.AsyncClient, url: str, body: bytes) -> Outcome:
    """One non-streamed chat completion (the cheapest call for the client, so the engines stay the
    bottleneck); only its latency and output tokens are kept."""
    outcome = Outcome()
    started = time.perf_counter()
    try:
        response = await client.post(url + "/v1/chat/completions", content=body, headers=_JSON)
        if response.status_code != 200:
            outcome.error = f"HTTP {response.status_code}: {response.content[:200]!r}"
        else:
            outcome.output_tokens = _answer.decode(response.content).usage.completion_tokens
    except (httpx.HTTPError, msgspec.DecodeError) as exc:
        outcome.error = repr(exc)
    outcome.latency_s = time.perf_counter() - started
    return outcome


async def stream_chat(client: httpx.AsyncClient, url: str, request: Request, user: str | None) -> Outcome:
    """One streamed chat completion; the text is kept so a conversation can continue."""
    body = chat_body(request, user, stream=True)
    outcome = Outcome()
    started = time.perf_counter()
    parts: list[str] = []
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", content=body, headers=_JSON
        ) as response:
            if response.status_code != 200:
                outcome.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = _chunk.decode(line[6:])
                for choice in chunk.choices:
                    if choice.delta.content:
                        if not parts:
                            outcome.ttft_s = time.perf_counter() - started
                        parts.append(choice.delta.content)
                if chunk.usage is not None:
                    outcome.output_tokens = chunk.usage.completion_tokens
    except (httpx.HTTPError, msgspec.DecodeError) as exc:
        outcome.error = repr(exc)
    outcome.latency_s = time.perf_counter() - started
    outcome.text = "".join(parts)
    return outcome


def _limits(connections: int) -> httpx.Limits:
    # Idle connections expire well before the servers' keep-alive timeout (uvicorn: 5 s), so a request
    # never goes out on a connection the server is closing.
    return httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2.0
    )


Target = Callable[[int], str]
"""Base URL for request number `group` (a router's URL, or a worker's for the oracle)."""


async def run_requests(
    requests: Sequence[Request], target: Target, concurrency: int, *, user_ids: bool
) -> RunResult:
    """Send `requests` (not streamed) in order with at most `concurrency` in flight (bench_serving's
    max-concurrency): `concurrency` senders, each with its own one-connection client, because one
    httpx pool with a hundred busy connections costs the load generator more CPU than the engines."""
    result = RunResult()
    bodies = [chat_body(r, f"group-{r.group}" if user_ids else None, stream=False) for r in requests]
    queue: asyncio.Queue[tuple[Request, bytes]] = asyncio.Queue()
    for item in zip(requests, bodies, strict=True):
        queue.put_nowait(item)

    async def sender() -> None:
        async with httpx.AsyncClient(timeout=600, limits=_limits(1), trust_env=False) as client:
            while not queue.empty():
                request, body = queue.get_nowait()
                result.outcomes.append(await complete_chat(client, target(request.group), body))

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - started
    return result


async def run_conversations(
    conversations: Sequence[Conversation], turns: int, target: Target, concurrency: int, ramp_s: float = 0.0
) -> RunResult:
    """`concurrency` users chatting at once, each on its own connection: a user takes the next
    conversation, sends its turns one after another carrying the history, then takes another. User i
    starts `ramp_s * i / concurrency` after the first, so the users do not send every turn in lockstep.
    The clients are made before the clock starts (making one costs ~10 ms of CPU: made inside the run,
    they would stall the load generator, and the first turns' measured TTFT, for half a second)."""
    result = RunResult()
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for conversation in conversations:
        queue.put_nowait(conversation)
    clients = [
        httpx.AsyncClient(timeout=600, limits=_limits(1), trust_env=False)
        for _ in range(min(concurrency, len(conversations)))
    ]

    async def talk(client: httpx.AsyncClient, conversation: Conversation) -> None:
        for turn in range(turns):
            request = conversation.turn(turn)
            user = f"conv-{conversation.group}"
            sent = time.perf_counter() - started
            outcome = await stream_chat(client, target(conversation.group), request, user)
            outcome.turn, outcome.started_s = turn, sent
            result.outcomes.append(outcome)
            if outcome.error is not None:
                return
            conversation.answered(turn, outcome.text)

    async def user(client: httpx.AsyncClient, index: int) -> None:
        async with client:
            await asyncio.sleep(ramp_s * index / len(clients))
            while not queue.empty():
                await talk(client, queue.get_nowait())

    started = time.perf_counter()
    await asyncio.gather(*(user(c, i) for i, c in enumerate(clients)))
    result.wall_s = time.perf_counter() - started
    return result
