"""What the telemetry says about real requests (openai SDK -> gateway -> test upstream): the SERVER
span names the listener, the peer and the User-Agent; a response-cache hit leaves its own span and
no CLIENT span; a stream records the GenAI server metrics and the time per output chunk."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from opentelemetry.sdk.metrics.export import HistogramDataPoint
from opentelemetry.trace import SpanKind

from proxy.telemetry import semconv
from tests.e2e.conftest import MODEL
from tests.e2e.test_traces import Recorded
from tests.proxy.telemetry.conftest import metric_points
from tests.upstream_server import Fault, UpstreamServer

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "Hi."}]


@pytest.fixture
def recorded(upstream: UpstreamServer) -> Iterator[Recorded]:
    gateway = Recorded(upstream)
    yield gateway
    gateway.close()


def _sdk(recorded: Recorded) -> openai.OpenAI:
    return openai.OpenAI(base_url=recorded.server.url, api_key="unused", max_retries=0, timeout=10)


def test_server_span_names_the_listener_the_peer_and_the_user_agent(recorded: Recorded) -> None:
    with _sdk(recorded) as sdk:
        sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    server, (client,) = recorded.request_spans()
    attributes = dict(server.attributes or {})
    assert attributes[semconv.SERVER_ADDRESS] == "127.0.0.1"
    assert attributes[semconv.SERVER_PORT] == recorded.server.port
    assert attributes[semconv.CLIENT_ADDRESS] == "127.0.0.1"
    assert str(attributes[semconv.USER_AGENT_ORIGINAL]).startswith("OpenAI/Python")
    assert dict(client.attributes or {})[semconv.SERVER_ADDRESS] == "127.0.0.1"


def test_a_response_cache_hit_has_its_own_span_and_calls_no_worker(
    recorded: Recorded, upstream: UpstreamServer
) -> None:
    with _sdk(recorded) as sdk:
        for _ in range(2):
            sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0)
    finished = recorded.spans.get_finished_spans()
    servers = [s for s in finished if s.kind is SpanKind.SERVER and "completions" in s.name]
    lookups = [s for s in finished if s.name == semconv.RESPONSE_CACHE_SPAN_NAME]
    assert len(servers) == 2 and len(lookups) == 2
    by_parent = {span.parent.span_id: span for span in lookups if span.parent is not None}
    miss, hit = (by_parent[server.context.span_id] for server in servers)
    assert dict(miss.attributes or {})[semconv.RESPONSE_CACHE_HIT] is False
    assert dict(hit.attributes or {})[semconv.RESPONSE_CACHE_HIT] is True
    assert dict(hit.attributes or {})[semconv.RESPONSE_CACHE_OUTCOME] == "hit"
    clients = [s for s in finished if s.kind is SpanKind.CLIENT]
    assert [c.parent.span_id for c in clients if c.parent] == [servers[0].context.span_id]
    assert len(upstream.generation_requests()) == 1
    metrics = httpx.get(f"{recorded.server.base_url}/metrics", timeout=5).text
    (count,) = [
        line for line in metrics.splitlines() if line.startswith("radixgate_response_cache_hit_seconds_count")
    ]
    assert float(count.split()[-1]) == 1.0


def test_a_stream_records_the_server_metrics_and_time_per_output_chunk(
    recorded: Recorded, upstream: UpstreamServer
) -> None:
    upstream.faults.append(Fault(first_token_delay_s=0.2))
    with _sdk(recorded) as sdk:
        stream = sdk.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) == 4
    points = metric_points(recorded.metrics.get_metrics_data())

    def one(name: str) -> HistogramDataPoint:
        (point,) = [p for p in points[name] if isinstance(p, HistogramDataPoint)]
        return point

    ttft = one(semconv.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)
    assert ttft.count == 1 and ttft.sum >= 0.2
    assert semconv.SERVER_ADDRESS not in ttft.attributes  # the server metrics describe the gateway
    assert ttft.explicit_bounds == semconv.SERVER_TIME_TO_FIRST_TOKEN_BUCKETS
    duration = one(semconv.GEN_AI_SERVER_REQUEST_DURATION)
    assert duration.count == 1 and duration.sum >= ttft.sum
    per_token = one(semconv.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN)
    assert per_token.count == 1 and per_token.sum < 0.2  # the first token's wait is not in it
    per_chunk = one(semconv.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK)
    assert per_chunk.count == 3  # four content chunks, three gaps between them
    assert one(semconv.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK).sum >= 0.2
