"""Follow-ups routed by `previous_response_id` against the cache-aware policy alone, on 4 simulated workers.

    flock /tmp/rg-bench.lock .venv/bin/python -m benchmarks.responses.affinity [--time-scale 0.1]

The same multi-turn conversations (one shared system prompt, each turn carrying the history) are
replayed twice over the same 4 simulated SGLang workers (`benchmarks.routing.sim_engine`), each
through its own `radixgate serve` with the default `cache_aware` policy:

    hinted     `POST /v1/responses`, every turn after the first naming the previous response: the
               gateway rebuilds the history and keeps the turn on the previous turn's worker while
               its load allows (`proxy.routing.affinity`)
    baseline   `POST /v1/chat/completions` with the whole history: the cache-aware policy alone

Reported per run: output tokens per wall second, output tokens per simulated second of the busiest
worker (the routing's effect alone), the workers' own prefix hit rate, and for the hinted run the
share of follow-ups the router kept on their previous worker (its `previous_turn` routing decisions).
At `--time-scale 1` a simulated worker is as fast as SGLang serving an 8B model on one GPU; at 0.1
the gateway's own CPU (on the same 2 cores as the workers and the client) weighs in the wall time.
Floors (issue 19): kept >= 95% while load allows; hinted throughput >= baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.routing.cluster import Cluster, Proc, flush_workers, worker_counters
from benchmarks.routing.sim_core import SimConfig
from benchmarks.routing.workload import Conversation, multi_turn, write_word_tokenizer
from proxy.telemetry.prometheus import METRIC_PREFIX
from proxy.telemetry.semconv import ROUTING_DECISIONS_METRIC

WORKERS = 4
SYSTEM_LEN, QUESTION_LEN, OUTPUT_LEN = 1024, 64, 64
TURNS, USERS = 5, 16
DEFAULT_CONVERSATIONS = 64
CAPACITY_TOKENS = 8 * SYSTEM_LEN + 24 * TURNS * (QUESTION_LEN + OUTPUT_LEN)
"""A few conversations' histories per worker beyond the system prompt: histories compete for the KV."""
OUT = Path(__file__).parent / "out"


@dataclass(slots=True)
class Run:
    name: str
    requests: int
    failures: int
    wall_s: float
    output_tokens: int
    hit_rate: float
    engine_throughput_tok_s: float
    """Output tokens per simulated second of the busiest worker: the routing's effect without the
    gateway's and the client's CPU (which share this host with the workers)."""
    kept_follow_ups: float | None = None

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.wall_s


async def talk_chat(client: httpx.AsyncClient, url: str, conversation: Conversation) -> list[int]:
    outputs = []
    for turn in range(TURNS):
        request = conversation.turn(turn)
        body = {"model": "sim-model", "messages": request.messages, "max_tokens": request.max_tokens}
        answer = (await client.post(url + "/v1/chat/completions", json=body)).raise_for_status().json()
        conversation.answered(turn, answer["choices"][0]["message"]["content"])
        outputs.append(answer["usage"]["completion_tokens"])
    return outputs


async def talk_responses(client: httpx.AsyncClient, url: str, conversation: Conversation) -> list[int]:
    outputs = []
    previous: str | None = None
    for turn in range(TURNS):
        body = {
            "model": "sim-model",
            "instructions": conversation.system,
            "input": conversation.questions[turn],
            "max_output_tokens": conversation.max_tokens,
        }
        if previous is not None:
            body["previous_response_id"] = previous
        answer = (await client.post(url + "/v1/responses", json=body)).raise_for_status().json()
        previous = answer["id"]
        outputs.append(answer["usage"]["output_tokens"])
    return outputs


async def replay(url: str, hinted: bool, count: int) -> tuple[int, int, float]:
    """(requests, output tokens, wall seconds) of `count` conversations, USERS at a time."""
    conversations = multi_turn(
        7,
        conversations=count,
        turns=TURNS,
        system_len=SYSTEM_LEN,
        question_len=QUESTION_LEN,
        output_len=OUTPUT_LEN,
    )
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for conversation in conversations:
        queue.put_nowait(conversation)
    outputs: list[int] = []
    talk = talk_responses if hinted else talk_chat

    async def user() -> None:
        async with httpx.AsyncClient(timeout=600, trust_env=False) as client:
            while not queue.empty():
                outputs.extend(await talk(client, url, queue.get_nowait()))

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(USERS)))
    return len(outputs), sum(outputs), time.perf_counter() - started


def kept_decisions(router: Proc) -> float:
    """`previous_turn` routing decisions the gateway made (summed over workers)."""
    name = METRIC_PREFIX + ROUTING_DECISIONS_METRIC
    text = httpx.get(router.url + "/metrics", timeout=10, trust_env=False).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and 'reason="previous_turn"' in line
    )


def run(name: str, router: Proc, workers: Sequence[Proc], hinted: bool, count: int) -> Run:
    flush_workers(workers)
    before = [worker_counters(w) for w in workers]
    requests, output_tokens, wall_s = asyncio.run(replay(router.url, hinted, count))
    after = [worker_counters(w) for w in workers]
    spent = [a.minus(b) for a, b in zip(after, before, strict=True)]
    prompt = sum(c.prompt_tokens for c in spent)
    result = Run(
        name,
        requests,
        count * TURNS - requests,
        round(wall_s, 2),
        output_tokens,
        round(sum(c.cached_tokens for c in spent) / prompt, 4) if prompt else 0.0,
        round(output_tokens / max(c.busy_s for c in spent), 1),
    )
    if hinted:
        result.kept_follow_ups = round(kept_decisions(router) / (count * (TURNS - 1)), 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--conversations", type=int, default=DEFAULT_CONVERSATIONS)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    tokenizer = write_word_tokenizer(OUT / "tokenizer.json")
    config_path = OUT / "gateway.toml"
    config_path.write_text(
        f'[upstream_client]\nhealth_timeout_s = 10.0\n\n[routing.tokenizers]\nsim-model = "{tokenizer}"\n'
    )
    config = SimConfig(capacity_tokens=CAPACITY_TOKENS, time_scale=args.time_scale)
    cluster = Cluster(OUT)
    started = time.time()
    try:
        workers = [cluster.sim_worker(i, config, tokenizer) for i in range(WORKERS)]
        routers = [
            cluster.gateway(name, workers, "cache_aware", config_path) for name in ("hinted", "baseline")
        ]
        cluster.wait_ready([*workers, *routers])
        count = args.conversations
        runs = [
            run("baseline", routers[1], workers, False, count),
            run("hinted", routers[0], workers, True, count),
        ]
    finally:
        cluster.stop()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "cpu": platform.processor() or platform.machine(),
        "runs": [
            {**{k: getattr(r, k) for k in r.__dataclass_fields__}, "throughput_tok_s": round(r.throughput, 1)}
            for r in runs
        ],
        "time_scale": args.time_scale,
        "hinted_over_baseline": round(runs[1].throughput / runs[0].throughput, 3),
        "hinted_over_baseline_engine": round(
            runs[1].engine_throughput_tok_s / runs[0].engine_throughput_tok_s, 3
        ),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
