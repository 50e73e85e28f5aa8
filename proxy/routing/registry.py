"""Names to objects: policies by name, engines by worker kind, worker ids from specs."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from adapters.base import Engine
from adapters.openai_compat import OpenAICompatEngine, UpstreamClientConfig
from adapters.sglang import SGLangEngine
from adapters.vllm import VLLMEngine
from proxy.routing.cache_aware import CacheAware
from proxy.routing.config import POLICY_NAMES, CacheAwareSettings, WorkerSpec
from proxy.routing.policies import LeastLoad, Policy, PowerOfTwo, RandomChoice, RoundRobin, Session


def build_policy(name: str, cache_aware: CacheAwareSettings) -> Policy:
    """The policy called `name`; ValueError names the valid ones."""
    policies: dict[str, Callable[[], Policy]] = {
        "cache_aware": lambda: CacheAware(cache_aware),
        "round_robin": RoundRobin,
        "random": RandomChoice,
        "power_of_two": PowerOfTwo,
        "least_load": LeastLoad,
        "session": Session,
    }
    factory = policies.get(name)
    if factory is None:
        raise ValueError(f"unknown routing policy {name!r}; expected one of {', '.join(POLICY_NAMES)}")
    return factory()


def worker_id_of(spec: WorkerSpec) -> str:
    """`KIND@HOST:PORT` for a worker configured without an id."""
    if spec.kind == "local":
        return "local"
    url = httpx.URL(spec.url)
    return f"{spec.kind}@{url.host}:{url.port or (443 if url.scheme == 'https' else 80)}"


def http_engine_factory(
    client: UpstreamClientConfig | None = None, local: Callable[[WorkerSpec], Engine] | None = None
) -> Callable[[WorkerSpec], Engine]:
    """Builds the adapter of each worker kind; `local` builds embedded engines when the app has them."""

    def build(spec: WorkerSpec) -> Engine:
        if spec.kind == "sglang":
            return SGLangEngine(spec.url, api_key=spec.api_key, config=client)
        if spec.kind == "vllm":
            return VLLMEngine(spec.url, api_key=spec.api_key, config=client)
        if spec.kind == "openai":
            return OpenAICompatEngine(spec.url, api_key=spec.api_key, config=client)
        if local is None:
            raise ValueError("a `local` worker needs the embedded engine; use `radixgate serve --workers N`")
        return local(spec)

    return build
