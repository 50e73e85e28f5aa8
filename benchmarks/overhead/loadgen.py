"""Open-loop (and closed-loop) HTTP/1.1 load generator on raw asyncio protocols (uvloop).

Open loop: request i is due at `start + i / rate` whatever happened to earlier ones; a request
goes out on an idle keep-alive connection or, when none is idle, on a new one, so a slow server
never slows the offered load (no coordinated omission). Latency runs from the moment the request
was written to the last byte of the answer; time to first chunk (streams) to the first body
chunk. The lag between a request's due time and its write is reported so a run can show the
generator kept up.

Closed loop (`--concurrency C`): C connections each send the next request as soon as the last
answer is complete; this measures maximum throughput.

    python -m benchmarks.overhead.loadgen --port 8080 --rate 300 --duration 10
    python -m benchmarks.overhead.loadgen --port 8080 --concurrency 64 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import uvloop

DEFAULT_MODEL = "stub-model"
PREWARMED_CONNECTIONS = 32
ANSWER_TIMEOUT_S = 30.0
"""After the last request is sent, how long to wait for the stragglers before counting them failed."""


PROMPT = "Say something short about foxes."


def request_bytes(host: str, port: int, path: str, model: str, stream: bool) -> bytes:
    """A chat request, or a text completion one when `path` is `/v1/completions` (as gRPC sends)."""
    question: dict[str, object] = (
        {"prompt": PROMPT}
        if path.endswith("/v1/completions")
        else {"messages": [{"role": "user", "content": PROMPT}]}
    )
    body = json.dumps(
        {"model": model, **question, "max_tokens": 16, "stream": stream}, separators=(",", ":")
    ).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer bench\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(slots=True)
class Sample:
    """One request's timeline (perf_counter seconds)."""

    due: float
    sent: float = 0.0
    first_chunk: float = 0.0
    done: float = 0.0
    status: int = 0


@dataclass(slots=True)
class Stats:
    samples: list[Sample] = field(default_factory=list)
    connections_opened: int = 0
    failures: int = 0


class Connection(asyncio.Protocol):
    """One keep-alive connection; parses Content-Length and chunked responses, nothing more."""

    def __init__(
        self, on_done: Callable[[Connection, Sample], None], on_lost: Callable[[Connection], None]
    ) -> None:
        self.on_done = on_done
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.sample: Sample | None = None
        self.buffer = b""
        self.in_body = False
        self.remaining = 0
        self.chunked = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(self)

    def send(self, payload: bytes, sample: Sample) -> None:
        assert self.transport is not None
        self.sample = sample
        self.buffer = b""
        self.in_body = False
        sample.sent = time.perf_counter()
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        sample = self.sample
        if sample is None:
            return
        self.buffer += data
        if not self.in_body:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            sample.status = int(head[9:12])
            self.chunked = b"transfer-encoding: chunked" in head
            if not self.chunked:
                start = head.find(b"content-length:") + 15
                self.remaining = int(
                    head[start : head.find(b"\r\n", start) if b"\r\n" in head[start:] else None]
                )
            self.buffer = self.buffer[end + 4 :]
            self.in_body = True
        if self.chunked:
            self._read_chunks(sample)
        else:
            if self.buffer and not sample.first_chunk:
                sample.first_chunk = time.perf_counter()
            if len(self.buffer) >= self.remaining:
                self._finish(sample)

    def _read_chunks(self, sample: Sample) -> None:
        while True:
            line_end = self.buffer.find(b"\r\n")
            if line_end < 0:
                return
            size = int(self.buffer[:line_end], 16)
            if size == 0:
                self._finish(sample)
                return
            if len(self.buffer) < line_end + 2 + size + 2:
                return
            if not sample.first_chunk:
                sample.first_chunk = time.perf_counter()
            self.buffer = self.buffer[line_end + 2 + size + 2 :]

    def _finish(self, sample: Sample) -> None:
        sample.done = time.perf_counter()
        self.sample = None
        self.buffer = b""
        self.on_done(self, sample)


class LoadGenerator:
    def __init__(self, host: str, port: int, payload: bytes) -> None:
        self.host = host
        self.port = port
        self.payload = payload
        self.idle: list[Connection] = []
        self.stats = Stats()
        self.waiters: dict[Connection, asyncio.Future[None]] = {}
        self.expected = 0
        self.all_answered = asyncio.Event()

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: Connection(self._done, self._lost), self.host, self.port
        )
        self.stats.connections_opened += 1
        return conn

    def _check_all_answered(self) -> None:
        if self.expected and len(self.stats.samples) + self.stats.failures >= self.expected:
            self.all_answered.set()

    def _done(self, conn: Connection, sample: Sample) -> None:
        self.stats.samples.append(sample)
        self._check_all_answered()
        waiter = self.waiters.pop(conn, None)
        if waiter is not None:
            waiter.set_result(None)
        else:
            self.idle.append(conn)

    def _lost(self, conn: Connection) -> None:
        if conn.sample is not None:
            self.stats.failures += 1
            conn.sample = None
            self._check_all_answered()
        if conn in self.idle:
            self.idle.remove(conn)
        waiter = self.waiters.pop(conn, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError("connection lost"))

    async def _send_on_new(self, sample: Sample) -> None:
        conn = await self.connect()
        conn.send(self.payload, sample)

    async def open_loop(self, rate: float, duration: float) -> list[float]:
        """Offer `rate` requests/s for `duration` s; returns the send lags (s)."""
        self.idle = [await self.connect() for _ in range(PREWARMED_CONNECTIONS)]
        interval = 1.0 / rate
        total = self.expected = int(rate * duration)
        lags: list[float] = []
        pending: set[asyncio.Task[None]] = set()
        start = time.perf_counter() + 0.01
        for i in range(total):
            due = start + i * interval
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            sample = Sample(due=due)
            if self.idle:
                self.idle.pop().send(self.payload, sample)
                lags.append(sample.sent - due)
            else:
                task = asyncio.create_task(self._send_on_new(sample))
                pending.add(task)
                task.add_done_callback(pending.discard)
        try:
            await asyncio.wait_for(self.all_answered.wait(), ANSWER_TIMEOUT_S)
        except TimeoutError:
            self.stats.failures += total - len(self.stats.samples) - self.stats.failures
        return lags

    async def closed_loop(self, concurrency: int, duration: float) -> None:
        """`concurrency` connections, each sending back to back until `duration` is over."""
        stop = time.perf_counter() + duration

        async def client() -> None:
            conn = await self.connect()
            loop = asyncio.get_running_loop()
            while time.perf_counter() < stop:
                waiter = loop.create_future()
                self.waiters[conn] = waiter
                conn.send(self.payload, Sample(due=time.perf_counter()))
                await waiter
            if conn.transport is not None:
                conn.transport.close()

        await asyncio.gather(*(client() for _ in range(concurrency)))


def percentiles(values: list[float], points: tuple[float, ...] = (50, 90, 99, 99.9)) -> dict[str, float]:
    """Nearest-rank percentiles in milliseconds, plus the maximum."""
    if not values:
        return {}
    ordered = sorted(values)
    result = {f"p{p:g}": ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] * 1000 for p in points}
    result["max"] = ordered[-1] * 1000
    return result


def summarise(stats: Stats, warmup_until: float, lags: list[float], elapsed: float) -> dict[str, object]:
    measured = [s for s in stats.samples if s.due >= warmup_until]
    ok = [s for s in measured if 200 <= s.status < 300]
    return {
        "requests": len(stats.samples),
        "measured": len(measured),
        "errors": len(measured) - len(ok) + stats.failures,
        "throughput_rps": len(stats.samples) / elapsed,
        "latency_ms": percentiles([s.done - s.sent for s in ok]),
        "ttfc_ms": percentiles([s.first_chunk - s.sent for s in ok if s.first_chunk]),
        "send_lag_ms": percentiles(lags),
        "connections_opened": stats.connections_opened,
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    payload = request_bytes(args.host, args.port, args.path, args.model, args.stream)
    generator = LoadGenerator(args.host, args.port, payload)
    started = time.perf_counter()
    lags: list[float] = []
    if args.concurrency:
        await generator.closed_loop(args.concurrency, args.duration)
    else:
        lags = await generator.open_loop(args.rate, args.duration)
    elapsed = time.perf_counter() - started
    summary = summarise(generator.stats, started + args.warmup, lags, elapsed)
    summary.update(
        mode="closed" if args.concurrency else "open",
        rate=args.rate,
        concurrency=args.concurrency,
        stream=args.stream,
        duration_s=args.duration,
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rate", type=float, default=100.0, help="open loop: requests per second")
    parser.add_argument("--concurrency", type=int, default=0, help="closed loop with this many clients")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds at the start left out of percentiles"
    )
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    json.dump(uvloop.run(run(args)), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
