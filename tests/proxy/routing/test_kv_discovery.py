"""Resolving the KV-event sockets an engine reports into addresses the gateway can reach."""

from __future__ import annotations

import pytest

from adapters.kv_events_info import KvEventsAdvert
from proxy.routing.kv_discovery import resolve

WORKER = "http://10.0.0.5:30000"


@pytest.mark.parametrize(
    ("replay", "seen"),
    [
        ("tcp://*:5558", "tcp://10.0.0.5:5558"),
        ("tcp://0.0.0.0:5558", "tcp://10.0.0.5:5558"),
        ("tcp://10.0.0.5:5558", "tcp://10.0.0.5:5558"),
        ("tcp://127.0.0.1:5558", None),  # the engine's own loopback: unreachable from here
        ("tcp://10.9.9.9:5558", None),  # another host: never followed
        ("ipc:///tmp/replay", None),
        (None, None),
    ],
)
def test_a_wildcard_bind_is_reached_on_the_workers_host(replay: str | None, seen: str | None) -> None:
    found = resolve(KvEventsAdvert("tcp://*:5557", replay, "kv"), WORKER)
    assert found.spec is not None
    assert (found.spec.endpoint, found.spec.replay_endpoint, found.spec.topic) == (
        "tcp://10.0.0.5:5557",
        seen,
        "kv",
    )


def test_loopback_sockets_of_a_loopback_worker_are_followed() -> None:
    found = resolve(KvEventsAdvert("tcp://[::]:5557", "tcp://127.0.0.1:5558"), "http://127.0.0.1:30000")
    assert found.spec is not None
    assert (found.spec.endpoint, found.spec.replay_endpoint) == (
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
    )


@pytest.mark.parametrize(
    ("advert", "why"),
    [
        # Without a wildcard both engines connect out to the address (a listener there collects).
        (KvEventsAdvert("tcp://10.0.0.7:5557"), "connects out"),
        (KvEventsAdvert("tcp://0.0.0.0:5557"), "connects out"),
        (KvEventsAdvert("ipc:///tmp/kv"), "not a TCP address"),
        (KvEventsAdvert("tcp://*:5557", ranks=tuple(range(300))), "data-parallel"),
    ],
)
def test_what_cannot_be_followed_says_why(advert: KvEventsAdvert, why: str) -> None:
    found = resolve(advert, WORKER)
    assert found.spec is None and why in found.note and "configure kv_events" in found.note
