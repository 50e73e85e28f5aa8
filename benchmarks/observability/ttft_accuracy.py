"""How close the gateway's time to first token is to the upstream's own, when the first token comes
long after the empty role chunk: the test upstream sends the role chunk at once and the first content
chunk `--delay` seconds later; the gateway's figure is the rise of its TTFT histogram's sum.

    python -m benchmarks.observability.ttft_accuracy [--runs 10] [--delay 0.3]
"""

from __future__ import annotations

import argparse
import json
import statistics

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import create_app
from tests.e2e.conftest import MODEL, gateway_settings
from tests.gateway_server import GatewayServer
from tests.upstream_server import Fault, UpstreamServer

SERIES = "radixgate_upstream_time_to_first_chunk_seconds_sum"


def _ttft_sum(gateway: GatewayServer) -> float:
    text = httpx.get(f"{gateway.base_url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == SERIES and sample.labels.get("model") == MODEL:
                return float(sample.value)
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.3)
    args = parser.parse_args()
    upstream = UpstreamServer(models=(MODEL,)).start()
    gateway = GatewayServer(create_app(gateway_settings(upstream.url))).start()
    gateway_s: list[float] = []
    upstream_s: list[float] = []
    try:
        with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
            for _ in range(args.runs):
                upstream.requests.clear()
                before = _ttft_sum(gateway)
                upstream.faults.append(Fault(first_token_delay_s=args.delay))
                messages: list[openai.types.chat.ChatCompletionMessageParam] = [
                    {"role": "user", "content": "hi"}
                ]
                for _chunk in sdk.chat.completions.create(
                    model=MODEL, messages=messages, stream=True, max_tokens=3
                ):
                    pass
                (request,) = upstream.generation_requests()
                assert request.first_token_sent_at is not None
                gateway_s.append(_ttft_sum(gateway) - before)
                upstream_s.append(request.first_token_sent_at - request.received_at)
    finally:
        gateway.stop()
        upstream.stop()
    diffs_ms = [(g - u) * 1e3 for g, u in zip(gateway_s, upstream_s, strict=True)]
    report = {
        "runs": args.runs,
        "gateway_median_ms": round(statistics.median(gateway_s) * 1e3, 2),
        "upstream_median_ms": round(statistics.median(upstream_s) * 1e3, 2),
        "diff_median_ms": round(statistics.median(diffs_ms), 2),
        "diff_min_ms": round(min(diffs_ms), 2),
        "diff_max_ms": round(max(diffs_ms), 2),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
