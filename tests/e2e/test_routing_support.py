"""The e2e routing harness's own promises: the ports it hands out, and what a worker that fails says."""

from __future__ import annotations

import socket

import pytest

from tests.e2e.routing_support import SimWorker, free_ports


def test_free_ports_are_distinct_and_each_pair_has_its_next_port_free() -> None:
    singles, pairs = free_ports(singles=3, pairs=4)
    every = [*singles, *pairs, *(port + 1 for port in pairs)]
    assert len(singles) == 3 and len(pairs) == 4 and len(set(every)) == len(every)
    for port in every:  # free once released
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_worker_that_cannot_start_says_why_and_is_gone() -> None:
    (http,), (events,) = free_ports(singles=1, pairs=1)
    with socket.socket() as taken:  # its replay socket's port is in use
        taken.bind(("127.0.0.1", events + 1))
        taken.listen()
        worker = SimWorker(http, extra_args=("--kv-events-port", str(events)))
        with pytest.raises(RuntimeError, match="Address already in use"):
            worker.start()
    assert worker.process is not None and worker.process.poll() is not None
    worker.stop()
    assert worker.stderr is None
