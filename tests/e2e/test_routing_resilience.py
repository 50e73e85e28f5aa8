"""Failover, circuit breaking and draining, against real worker processes behind a real gateway."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import openai

from tests.e2e.routing_support import (
    MODEL,
    admin_workers,
    start_gateway,
    start_workers,
    stop_all,
    wait_for,
)


def ask(client: openai.OpenAI, number: int, max_tokens: int = 8) -> str:
    answer = client.chat.completions.create(
        model=MODEL,
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": f"request number {number} " * 20}],
    )
    return answer.choices[0].message.content or ""


def test_a_worker_killed_under_load_fails_no_request() -> None:
    workers = start_workers(3, time_scale=0.2)
    gateway = start_gateway(workers, policy="round_robin")
    failures: list[BaseException] = []
    done = 0
    try:
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=30) as client:

            def one(number: int) -> None:
                nonlocal done
                try:
                    ask(client, number, max_tokens=24)
                    done += 1
                except BaseException as exc:  # collected: the test asserts there are none
                    failures.append(exc)

            with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
                futures = [pool.submit(one, n) for n in range(90)]
                wait_for(lambda: done >= 15)
                workers[0].kill()  # mid-load: its in-flight requests lose their connections
                concurrent.futures.wait(futures)
        assert failures == []
        assert done == 90
        wait_for(lambda: admin_workers(gateway)["w0"]["health"] == "down")
    finally:
        gateway.stop()
        stop_all(workers)


def test_the_breaker_opens_on_failing_requests_and_closes_when_the_worker_is_back() -> None:
    workers = start_workers(2)
    # Health checks are rare here, so only the requests' own outcomes move the breaker.
    gateway = start_gateway(
        workers,
        policy="round_robin",
        health_interval_s=60,
        breaker={"failure_threshold": 2, "cooldown_s": 0.5, "max_cooldown_s": 1.0},
    )
    try:
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as client:
            workers[0].kill()
            for number in range(6):  # retried on w1 each time: the client sees no error
                ask(client, number)
            assert admin_workers(gateway)["w0"]["circuit"] == "open"
            served_while_open = workers[1].requests_served()
            for number in range(4):
                ask(client, number)
            assert workers[1].requests_served() - served_while_open == 4  # w0 was skipped, not retried
            workers[0].start()  # same port: the engine is back
            time.sleep(0.6)  # past the cooldown: the next request to w0 is the half-open trial
            wait_for(lambda: (ask(client, 99), admin_workers(gateway)["w0"]["circuit"] == "closed")[1])
            before = workers[0].requests_served()
            for number in range(4):
                ask(client, number)
            assert workers[0].requests_served() - before == 2  # round robin includes w0 again
    finally:
        gateway.stop()
        stop_all(workers)


def test_a_removed_worker_drains_its_requests_then_leaves() -> None:
    workers = start_workers(2, time_scale=1.0)  # slow engines: requests stay in flight for a while
    gateway = start_gateway(workers, policy="round_robin")
    results: list[str] = []
    try:
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0, timeout=60) as client:
            threads = [
                # ~6 s each on these engines: the drain below must catch them in flight on a loaded box
                threading.Thread(target=lambda n=n: results.append(ask(client, n, 400)))
                for n in range(4)
            ]
            for thread in threads:
                thread.start()
            wait_for(lambda: admin_workers(gateway)["w0"]["in_flight"] == 2)
            removed = httpx.delete(gateway.base_url + "/admin/workers/w0")
            assert removed.status_code == 202
            assert removed.json() == {"id": "w0", "state": "draining", "in_flight": 2}
            assert admin_workers(gateway)["w0"]["draining"] is True
            before = workers[1].requests_served()
            ask(client, 100, max_tokens=2)  # new work goes to the remaining worker only
            assert workers[1].requests_served() - before == 1
            for thread in threads:
                thread.join(60)
            assert len(results) == 4 and all(results)  # the drained worker finished its requests
            wait_for(lambda: "w0" not in admin_workers(gateway))
    finally:
        gateway.stop()
        stop_all(workers)
