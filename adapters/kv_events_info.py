"""What an engine says about its own KV-event publisher, read from its introspection endpoints.

- SGLang: `/server_info` (older: `/get_server_info`) carries the server arguments, among them
  `kv_events_config`, the JSON string given to `--kv-events-config` (None when events are off), and
  `dp_size` / `enable_dp_attention`: its publishers are numbered by attention-DP rank, so with DP
  attention ranks 0 .. dp_size - 1 publish (without it every scheduler is rank 0).
- vLLM: `/server_info?config_format=json` (served only with `VLLM_SERVER_DEV_MODE=1`) carries
  `vllm_config.kv_events_config` (`enable_kv_cache_events`, `publisher`, ...) and
  `vllm_config.parallel_config`: `data_parallel_size`, `data_parallel_size_local` (the ranks on
  this host), `data_parallel_rank` and the load-balancing mode. The ranks behind one API server
  whose publishers run on its host: its own rank alone in external-LB mode (one server per rank),
  its node's ranks from `data_parallel_rank` in hybrid-LB mode, else ranks 0 .. size_local - 1.

Both take the same keys (`publisher`, `endpoint`, `replay_endpoint`, `topic`); the addresses are the
ones the engine binds (`tcp://*:5557`), which the router resolves against the worker's host
(`proxy.routing.kv_discovery`); rank r publishes on their ports plus r.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

DEFAULT_ENDPOINT = "tcp://*:5557"
"""The PUB address both engines bind when `endpoint` is left out."""
MAX_REPORTED_RANKS = 4_096
"""Data-parallel sizes are read up to this (a server reporting more is not believed further: the
router follows far fewer, see `proxy.routing.config.MAX_DATA_PARALLEL_RANKS`)."""


@dataclass(frozen=True, slots=True)
class KvEventsAdvert:
    """An engine's KV-event publisher settings as it reports them."""

    endpoint: str
    """Its PUB address, as configured on the engine (`tcp://*:5557`)."""
    replay_endpoint: str | None = None
    """Its ROUTER replay address, None when it has none."""
    topic: str = ""
    ranks: tuple[int, ...] = (0,)
    """The data-parallel ranks behind this server that publish on its host, each on the
    endpoint's (and the replay endpoint's) port plus its rank."""


class _PublisherConfig(msgspec.Struct):
    publisher: str | None = None
    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    topic: str = ""
    enable_kv_cache_events: bool | None = None


def parse_publisher(value: object, ranks: tuple[int, ...] = (0,)) -> KvEventsAdvert | None:
    """The advert in an engine's `kv_events_config` (a JSON string or an object); None when events
    are off, the publisher is not ZMQ, or the value is not a publisher config."""
    try:
        if isinstance(value, str) and value.strip():
            config = msgspec.json.decode(value, type=_PublisherConfig)
        elif isinstance(value, dict):
            config = msgspec.convert(value, _PublisherConfig)
        else:
            return None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if config.enable_kv_cache_events is False:
        return None
    # vLLM picks "zmq" when events are enabled and no publisher is named; SGLang needs it named.
    publisher = config.publisher or ("zmq" if config.enable_kv_cache_events else "null")
    if publisher != "zmq":
        return None
    return KvEventsAdvert(
        endpoint=config.endpoint,
        replay_endpoint=config.replay_endpoint or None,
        topic=config.topic,
        ranks=ranks or (0,),
    )


def sglang_advert(info: dict[str, Any]) -> KvEventsAdvert | None:
    """The advert in SGLang's `/server_info`."""
    dp_size = _count(info.get("dp_size"))
    ranks = tuple(range(dp_size)) if info.get("enable_dp_attention") else (0,)
    return parse_publisher(info.get("kv_events_config"), ranks)


def vllm_advert(info: dict[str, Any]) -> KvEventsAdvert | None:
    """The advert in vLLM's `/server_info?config_format=json`."""
    config = info.get("vllm_config")
    if not isinstance(config, dict):
        return None  # the text format (older vLLM): no structured config to read
    parallel = config.get("parallel_config")
    ranks = vllm_ranks(parallel if isinstance(parallel, dict) else {})
    return parse_publisher(config.get("kv_events_config"), ranks)


def vllm_ranks(parallel: dict[str, Any]) -> tuple[int, ...]:
    """The data-parallel ranks whose publishers run beside a vLLM API server, from its parallel config."""
    size = _count(parallel.get("data_parallel_size"))
    local = min(size, _count(parallel.get("data_parallel_size_local"), size))
    rank = parallel.get("data_parallel_rank")
    rank = rank if isinstance(rank, int) and 0 <= rank < size else 0
    if parallel.get("data_parallel_external_lb"):
        return (rank,)
    if parallel.get("data_parallel_hybrid_lb"):
        return tuple(range(rank, min(size, rank + local)))
    return tuple(range(local))


def _count(value: object, default: int = 1) -> int:
    """A positive count from an engine's config, at most `MAX_REPORTED_RANKS` (anything else: `default`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, MAX_REPORTED_RANKS)
    return default
