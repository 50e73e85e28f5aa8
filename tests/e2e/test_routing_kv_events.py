"""KV-event routing end to end: simulated SGLang workers publish their cache's blocks over ZMQ and
the gateway routes by them, one worker's sockets configured, the other's found in its `/server_info`
(and its admin API shows each feed and where it came from)."""

from __future__ import annotations

import openai

from benchmarks.routing.cluster import LoopbackPorts
from proxy.routing.config import KvEventsSpec, WorkerSpec
from tests.e2e.routing_support import (
    MODEL,
    SimWorker,
    admin_workers,
    start_gateway,
    stop_all,
    wait_for,
)

SYSTEM = "You are the assistant of a very particular shop that sells only blue things. " * 12


def test_requests_follow_the_blocks_the_engines_report_configured_or_discovered() -> None:
    loopback = LoopbackPorts()
    ports = [loopback.event_port() for _ in range(2)]  # each KV-event port's replay socket is one up
    workers = [SimWorker(loopback.port(), extra_args=("--kv-events-port", str(port))) for port in ports]
    specs = [
        WorkerSpec(
            url=w.url,
            kind="sglang",
            models=[MODEL],
            id=f"w{i}",
            kv_events=KvEventsSpec(
                endpoint=f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{port + 1}"
            )
            if i == 0
            else None,  # w1's are in its /server_info: `tcp://*:PORT`, resolved to its host
        )
        for i, (w, port) in enumerate(zip(workers, ports, strict=True))
    ]
    gateway = None
    try:
        for worker in workers:
            worker.start()
        gateway = start_gateway(workers, specs=specs)
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=30) as client:
            # ZMQ subscribers join late: ask until an engine's events have reached the gateway.
            def events_seen() -> bool:
                client.chat.completions.create(
                    model=MODEL,
                    max_tokens=4,
                    messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
                )
                rows = admin_workers(gateway)
                return any((row["kv_events"] or {}).get("blocks", 0) > 0 for row in rows.values())

            wait_for(events_seen, timeout_s=15)
            rows = admin_workers(gateway)
            assert rows["w0"]["kv_events"]["source"] == "config"
            assert rows["w1"]["kv_events"]["source"] == (
                f"discovered: tcp://*:{ports[1]}, replay tcp://127.0.0.1:{ports[1] + 1}"
            )
            assert rows["w1"]["kv_events"]["endpoint"] == f"tcp://127.0.0.1:{ports[1]}"
            home = max(rows, key=lambda worker_id: rows[worker_id]["kv_events"]["blocks"])
            feed = rows[home]["kv_events"]
            assert feed["live"] and feed["block_size"] == 16 and feed["blocks_by_medium"]["GPU"] > 10
            before = rows[home]["requests"]
            for question in ("what is blue?", "and what is not?", "how much is it?"):
                answer = client.chat.completions.create(
                    model=MODEL,
                    max_tokens=4,
                    messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                )
                usage = answer.usage
                assert usage is not None and usage.prompt_tokens_details is not None
                assert (usage.prompt_tokens_details.cached_tokens or 0) > len(SYSTEM) * 0.9
            after = admin_workers(gateway)[home]
            assert after["requests"] == before + 3  # all three followed the blocks
            # Predictions from the events are exact to within a block per request.
            assert (
                abs(after["predicted_cached_tokens"] - after["reported_cached_tokens"])
                < 16 * after["predictions"]
            )
    finally:
        if gateway is not None:
            gateway.stop()
        stop_all(workers)
