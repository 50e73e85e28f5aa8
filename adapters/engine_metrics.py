"""What SGLang and vLLM report about themselves beyond `Engine`: load, KV capacity, tokenization.

The router probes adapters for these optional abilities with the `runtime_checkable` protocols below;
an adapter that lacks one is simply routed without it (its capacity comes from configuration).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from adapters.kv_events_info import KvEventsAdvert
    from adapters.spec_metrics import UpstreamSpeculation


@dataclass(slots=True, frozen=True)
class EngineLoad:
    """An engine's own view of its load, read from its Prometheus `/metrics`."""

    running: float | None = None
    """Requests in the running batch."""
    waiting: float | None = None
    """Requests queued for admission."""
    kv_usage: float | None = None
    """Fraction of the KV pool in use, 0..1."""
    cache_hit_rate: float | None = None
    """Prefix-cache hit rate, 0..1 (tokens for SGLang, cumulative queries for vLLM)."""
    speculation: UpstreamSpeculation | None = None
    """The engine's own speculative-decoding figures, when it speculates (`adapters.spec_metrics`)."""


@runtime_checkable
class ReportsLoad(Protocol):
    async def load(self) -> EngineLoad:
        """Scrape the engine's metrics."""
        ...


@runtime_checkable
class ListsModels(Protocol):
    async def list_models(self) -> list[str]:
        """The model ids the engine serves (`GET /v1/models`)."""
        ...


@runtime_checkable
class ReportsCapacity(Protocol):
    async def kv_capacity_tokens(self) -> int | None:
        """Tokens the engine's KV pool holds (SGLang `max_total_num_tokens`), None if not reported."""
        ...


@runtime_checkable
class Tokenizes(Protocol):
    async def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as the engine tokenizes it."""
        ...


@runtime_checkable
class ServesResponses(Protocol):
    async def serves_responses(self) -> bool:
        """Whether the engine serves `POST /v1/responses` itself."""
        ...

    async def delete_response(self, response_id: str) -> bool:
        """Delete a response the engine stored; False when it had none or refused."""
        ...


@runtime_checkable
class NamesTokenizer(Protocol):
    async def tokenizer_path(self) -> str | None:
        """Where the engine loaded its tokenizer from (a tokenizer.json or a model directory, a path
        on the engine's host), None when it does not say."""
        ...


@runtime_checkable
class AdvertisesKvEvents(Protocol):
    async def kv_events_advert(self) -> KvEventsAdvert | None:
        """The engine's KV-event publisher settings as it reports them (`adapters.kv_events_info`),
        None when it publishes none or does not say."""
        ...


@runtime_checkable
class FlushesCache(Protocol):
    async def flush_cache(self) -> bool:
        """Drop the engine's prefix cache; False when the engine refused (e.g. busy)."""
        ...


def parse_prometheus(text: str, names: Iterable[str]) -> dict[str, float]:
    """Sum of each named sample over its label sets, for the names present in `text`.

    `names` are full sample names (`sglang:num_running_reqs`, `vllm:prefix_cache_hits_total`).
    Comment lines and other series are skipped; a series with several label sets (one per model
    or engine rank) is summed, which is the worker's total.
    """
    wanted = set(names)
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        name = line[:end] if end >= 0 else line
        if name not in wanted:
            continue
        value_part = line[line.rfind("}") + 1 :] if brace >= 0 else line[space:]
        fields = value_part.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        found[name] = found.get(name, 0.0) + value
    return found


@runtime_checkable
class LoadsInProcess(Protocol):
    async def start(self) -> None:
        """Load the engine in this process (the embedded one: seconds, longer than a health
        check's timeout); idempotent."""
