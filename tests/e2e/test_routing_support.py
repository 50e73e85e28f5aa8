"""The e2e routing harness's own promises: the ports it hands out, and what a worker that fails says."""

from __future__ import annotations

import socket

import pytest

from benchmarks.routing.cluster import LoopbackPorts
from tests.e2e.routing_support import SimWorker


def test_loopback_ports_are_distinct_and_each_event_port_has_its_next_port_free() -> None:
    loopback = LoopbackPorts()
    pairs = [loopback.event_port() for _ in range(4)]
    singles = [loopback.port() for _ in range(3)]
    every = [*singles, *pairs, *(port + 1 for port in pairs)]
    assert len(set(every)) == len(every)
    for port in every:  # free once released
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_worker_that_cannot_start_says_why_and_is_gone() -> None:
    loopback = LoopbackPorts()
    events, http = loopback.event_port(), loopback.port()
    with socket.socket() as taken:  # its replay socket's port is in use
        taken.bind(("127.0.0.1", events + 1))
        taken.listen()
        worker = SimWorker(http, extra_args=("--kv-events-port", str(events)))
        with pytest.raises(RuntimeError, match="Address already in use"):
            worker.start()
    assert worker.process is not None and worker.process.poll() is not None
    worker.stop()
    assert worker.stderr is None
