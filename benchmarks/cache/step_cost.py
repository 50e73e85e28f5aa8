"""The response-cache step alone, in this process, in front of an instant upstream: CPU per request
on each path (miss with or without a store, L3 write-behind, hit, bypass) and its share of what a
forwarded request costs the gateway. Run as part of `benchmarks.cache.bench_response_cache`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from adapters.base import Completion, EngineRequest
from adapters.schema import ChatCompletionRequest, probe_response
from benchmarks.overhead.stub import COMPLETION
from cachelayer.admission import AdmissionGate, AdmissionPolicy
from cachelayer.responses import ResponseCache
from cachelayer.tiers import TieredStore
from proxy.asgi_types import Message, Send
from proxy.cache.config import ContextCacheConfig
from proxy.cache.settings import CacheSettings
from proxy.cache.step import ResponseCacheStep

MODEL = "stub-model"
_JSON_HEADERS = ((b"content-type", b"application/json"), (b"content-length", str(len(COMPLETION)).encode()))


async def _step_cpu_us(step: ResponseCacheStep, requests: list[EngineRequest]) -> float:
    """Process CPU microseconds per request through `step` in front of an instant upstream."""

    async def send(_: Message) -> None:
        return None

    probe = probe_response(COMPLETION)
    completion = Completion(  # what the gateway's handler hands back after sending a JSON answer
        body=COMPLETION,
        usage=probe.usage,
        finish_reasons=[choice.finish_reason for choice in probe.choices if choice.finish_reason],
        choices=len(probe.choices),
    )

    async def forward(send: Send) -> Completion:
        await send({"type": "http.response.start", "status": 200, "headers": list(_JSON_HEADERS)})
        await send({"type": "http.response.body", "body": COMPLETION})
        return completion

    started = time.process_time()
    for request in requests:
        await step.respond(request, [], [], send, forward)
        await asyncio.sleep(0)  # a server's loop turns between requests: the store task runs here
    await step.drain()
    if step.cache is not None:
        step.cache.close()  # inside the timing: the L3 writer thread finishes its queued files here
    return 1e6 * (time.process_time() - started) / len(requests)


def _engine_request(number: int | None, temperature: float) -> EngineRequest:
    content = "Say something short about foxes." if number is None else f"Say something about fox {number}."
    raw = msgspec.json.encode(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 16,
            "temperature": temperature,
        }
    )
    params = msgspec.json.decode(raw, type=ChatCompletionRequest)
    return EngineRequest("chat", params, raw, "bench", "tenant", "salt")


def step_rows(args: argparse.Namespace, gateway_cpu_us: float, workdir: Path) -> list[str]:
    """The cache step alone, in this process: CPU per request for each path (all threads, so the
    disk writes of the L3 variant count), and its share of a forwarded request's gateway CPU."""
    count, rounds = args.step_requests, 5
    config = ContextCacheConfig.development()

    def memory_step(_: Path, admission: AdmissionPolicy = "always") -> ResponseCacheStep:
        store = TieredStore.from_config(config.response_store(CacheSettings()))
        return ResponseCacheStep(ResponseCache(store), admission=AdmissionGate(admission))

    def disk_step(directory: Path) -> ResponseCacheStep:
        store = TieredStore.from_config(config.response_store(CacheSettings(dir=directory)))
        return ResponseCacheStep(ResponseCache(store), admission=AdmissionGate("always"))

    def selective_step(directory: Path) -> ResponseCacheStep:  # what `adaptive` does once no reuse is seen
        return memory_step(directory, "second_sighting")

    variants: list[tuple[str, Callable[[Path], ResponseCacheStep], Callable[[int], EngineRequest]]] = [
        ("cache off", lambda _: ResponseCacheStep(None), lambda n: _engine_request(n, 0.0)),
        (
            "miss, admission selective (new body: no key, lookup or store)",
            selective_step,
            lambda n: _engine_request(n, 0.0),
        ),
        ("miss + store (new deterministic request)", memory_step, lambda n: _engine_request(n, 0.0)),
        ("miss + store, L3 dir (write-behind segment)", disk_step, lambda n: _engine_request(n, 0.0)),
        ("hit (same deterministic request)", memory_step, lambda _: _engine_request(None, 0.0)),
        ("bypass (sampled request)", memory_step, lambda _: _engine_request(None, 0.7)),
    ]
    measured: dict[str, list[float]] = {name: [] for name, *_ in variants}
    for round_number in range(rounds):
        for number, (name, make_step, make_request) in enumerate(variants):
            requests = [make_request(round_number * count + n) for n in range(count)]
            step = make_step(workdir / f"step-{round_number}-{number}")
            measured[name].append(asyncio.run(_step_cpu_us(step, requests)))
    off = statistics.median(measured["cache off"])
    rows = []
    for name, values in measured.items():
        cpu = statistics.median(values)
        extra = cpu - off
        rows.append(f"| {name} | {cpu:.1f} | {extra:+.1f} | {100 * extra / gateway_cpu_us:+.2f}% |")
    return rows
