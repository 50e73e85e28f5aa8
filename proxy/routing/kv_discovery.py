"""Finding a worker's KV-event sockets without configuration, from what its engine reports.

A worker whose `kv_events` is not configured is asked once it is seen up (SGLang `/server_info`'s
`kv_events_config`; vLLM's `/server_info?config_format=json`, served in its dev mode only; see
`adapters.kv_events_info`). The engine reports the addresses it was told to use, which are its own
view: both engines bind their PUB socket when the address is a wildcard (`tcp://*:5557`,
`tcp://[::]:5557`) and otherwise connect out to it (a listener elsewhere collects the events), and
always bind the replay socket. So, as seen from the gateway:

    PUB  tcp://*:P, tcp://[::]:P                  -> tcp://WORKER_HOST:P
         tcp://HOST:P (the engine connects out)   -> not followed: configure `kv_events`
    ROUTER tcp://*:P, tcp://0.0.0.0:P, [::]       -> tcp://WORKER_HOST:P
         the worker's own host                     -> as reported
         loopback, on a worker that is not         -> dropped (a gap then resets the index)
         any other host                            -> dropped

Only TCP addresses on the worker's own host are followed, so a worker cannot point the gateway at
other machines or local socket files (`ipc://`: configure it). A data-parallel engine publishes one
stream per rank, on the reported ports plus the rank (`adapters.kv_events_info` says which ranks run
beside the worker's API server): the feed follows each of them as the same worker. Configured
`kv_events` always win; `GET /admin/workers` shows each feed's `source`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from adapters.engine_metrics import AdvertisesKvEvents
from adapters.kv_events_info import KvEventsAdvert
from proxy.routing.config import MAX_DATA_PARALLEL_RANKS, KvEventsSpec
from proxy.routing.kv_events import KvEventFeed
from proxy.routing.worker import Worker

logger = logging.getLogger("radixgate.routing.kv_discovery")

_TCP = re.compile(r"^tcp://(?P<host>\*|\[[^\]]*\]|[^:/\[\]]+):(?P<port>[0-9]{1,5})$")
_WILDCARDS = frozenset({"*", "0.0.0.0", "[::]", "::", "[::0]"})
_PUB_BINDS = frozenset({"*", "[::]", "::", "[::0]"})
"""The PUB addresses the engines bind (their rule: a `*` or `::` binds, anything else connects)."""
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
MAX_PORT = 65_535


@dataclass(frozen=True, slots=True)
class Resolved:
    """A discovered feed, or why there is none."""

    spec: KvEventsSpec | None
    note: str
    """What was found, for the log and `GET /admin/workers` (`discovered from ...`, or the reason)."""


def resolve(advert: KvEventsAdvert, worker_url: str) -> Resolved:
    """The sockets the gateway connects to for an engine reporting `advert` behind `worker_url`."""
    host = (urlsplit(worker_url).hostname or "").lower()
    if len(advert.ranks) > MAX_DATA_PARALLEL_RANKS:
        return Resolved(None, f"{len(advert.ranks)} data-parallel ranks: configure kv_events")
    pub = _TCP.match(advert.endpoint)
    if pub is None:
        return Resolved(None, f"{advert.endpoint} is not a TCP address: configure kv_events")
    if pub["host"] not in _PUB_BINDS:
        return Resolved(None, f"the engine connects out to {advert.endpoint}: configure kv_events")
    replay = _replay_address(advert.replay_endpoint, host)
    for port in (pub["port"], (replay or ":0").rpartition(":")[2]):
        if int(port) + max(advert.ranks) > MAX_PORT:
            return Resolved(None, f"rank {max(advert.ranks)} would publish past port {MAX_PORT}")
    spec = KvEventsSpec(
        endpoint=f"tcp://{host}:{pub['port']}",
        replay_endpoint=replay,
        topic=advert.topic,
        data_parallel_ranks=frozenset(advert.ranks),
    )
    ranks = f", data-parallel ranks {list(advert.ranks)}" if advert.ranks != (0,) else ""
    note = f"discovered: {advert.endpoint}" + (f", replay {replay}" if replay else "") + ranks
    return Resolved(spec, note)


def _replay_address(reported: str | None, host: str) -> str | None:
    if reported is None:
        return None
    match = _TCP.match(reported)
    if match is None:
        return None
    bound = match["host"].lower()
    if bound in _WILDCARDS or bound == host or (bound in _LOOPBACK and host in _LOOPBACK):
        return f"tcp://{host}:{match['port']}"
    return None


async def discover_kv_events(worker: Worker, timeout_s: float) -> Resolved:
    """What `worker`'s engine reports about its KV events, resolved (never raises)."""
    engine = worker.engine
    if not isinstance(engine, AdvertisesKvEvents):
        return Resolved(None, "the engine does not report its KV events")
    try:
        async with asyncio.timeout(timeout_s):
            advert = await engine.kv_events_advert()
    except Exception as exc:  # an engine that cannot say is routed by its tree
        logger.debug("KV events of %s unknown: %r", worker.id, exc)
        return Resolved(None, "the engine's server info could not be read")
    if advert is None:
        return Resolved(None, "the engine publishes no KV events")
    return resolve(advert, worker.spec.url)


async def rediscover(worker: Worker, timeout_s: float, clock: Callable[[], float]) -> bool:
    """Ask a worker seen up about its KV events, unless they are configured; True when its feed
    changed (a new one to subscribe, or the old one to stop): the engine may have restarted."""
    if worker.spec.kv_events is not None:
        return False
    found = await discover_kv_events(worker, timeout_s)
    worker.kv_events_discovery = found.note if found.spec is None else None
    current = worker.kv_events
    if (current.spec if current is not None else None) == found.spec:
        return False
    worker.kv_events = None if found.spec is None else KvEventFeed(found.spec, clock, found.note)
    logger.info("KV events of %s: %s", worker.id, found.note)
    return True
