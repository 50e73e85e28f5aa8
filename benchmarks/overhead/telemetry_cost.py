"""CPU cost of radixgate's telemetry per request, measured in isolation.

Drives the server-span middleware around a bare ASGI app and one `start_operation`/`succeed`
pair per request, directly (no sockets), and reports microseconds of CPU per request for:

    bare        the ASGI app alone (the baseline)
    noop        telemetry without an exporter (the default: Prometheus series, no spans recorded)
    sdk_traces  spans recorded by the SDK into a batch processor whose exporter drops them
    sdk_metrics the GenAI histograms recorded on an SDK meter
    sdk         both (what an OTLP setup of traces and metrics costs in-process)

    python -m benchmarks.overhead.telemetry_cost --requests 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from adapters.base import EngineRequest
from adapters.schema import ChatCompletionRequest, ChatMessage, Usage
from proxy.telemetry import Telemetry, TelemetrySettings

TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class DroppingExporter(SpanExporter):
    """Accepts every batch and keeps nothing: the in-process cost without network I/O."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@dataclass(slots=True)
class BenchEngine:
    provider_name: str = "openai"
    server_address: str = "127.0.0.1"
    server_port: int | None = 9100


def _request() -> EngineRequest:
    params = ChatCompletionRequest(
        model="stub-model", messages=[ChatMessage(role="user", content="hi")], max_tokens=16, temperature=0.7
    )
    return EngineRequest(
        operation="chat", params=params, raw_body=b"{}", request_id="r", tenant_id="t", cache_salt="s"
    )


async def _measure(telemetry: Telemetry | None, requests: int) -> float:
    engine = BenchEngine()
    usage = Usage(prompt_tokens=12, completion_tokens=10, total_tokens=22)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if telemetry is not None:
            operation = telemetry.start_operation(_request(), engine)
            operation.succeed(
                response_id="chatcmpl-1", response_model="stub-model", finish_reasons=["stop"], usage=usage
            )
        scope["path_template"] = "/v1/chat/completions"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    wrapped = telemetry.middleware(app=app) if telemetry is not None else app

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        return None

    headers = [(b"host", b"gw"), (b"content-type", b"application/json"), (b"traceparent", TRACEPARENT)]
    started = time.process_time()
    for _ in range(requests):
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
        await wrapped(scope, receive, send)
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    settings = TelemetrySettings()
    variants: dict[str, Telemetry | None] = {
        "bare": None,
        "noop": Telemetry.from_settings(TelemetrySettings(enabled=False), service_version="bench"),
        "sdk_traces": Telemetry.from_settings(
            settings, service_version="bench", tracer_provider=tracer_provider
        ),
        "sdk_metrics": Telemetry.from_settings(
            settings, service_version="bench", meter_provider=meter_provider
        ),
        "sdk": Telemetry.from_settings(
            settings, service_version="bench", tracer_provider=tracer_provider, meter_provider=meter_provider
        ),
    }
    results = {}
    for name, telemetry in variants.items():
        asyncio.run(_measure(telemetry, 2000))  # warm caches and label children
        results[name] = round(min(asyncio.run(_measure(telemetry, args.requests)) for _ in range(3)), 1)
    tracer_provider.shutdown()
    print(json.dumps({"cpu_us_per_request": results}))


if __name__ == "__main__":
    main()
