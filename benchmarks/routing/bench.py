"""Routing benchmark: every policy over the same simulated workers, in one run, plus sglang-router.

    .venv/bin/python -m benchmarks.routing.bench [--time-scale 0.25] [--offer-tokenizer none]

For each workload (generated-shared-prefix, multi-turn over one system prompt, skewed popularity, no
sharing) and each router (radixgate with every policy, sglang-router `cache_aware` when the `bench`
extra's `sglang-router` is installed, and a sticky oracle that sends each group straight to one
worker), the workers' caches are flushed, the workload is replayed, and the workers' own counters
give the token hit rate and the per-worker request spread. Throughput is output tokens per wall
second; TTFT is to the first streamed content. Results go to stdout (a Markdown table) and to
`benchmarks/routing/out/results.json`. `--rounds N` replays each workload N times with the routers
taking turns and reports medians: on a two-core host that the workers, the client and the router
share, a wall-clock tail (multi-turn TTFT p99) moves several-fold between back-to-back replays, the
sticky oracle's too, so one replay cannot judge a p99 floor.

The gateways run with the shipped routing defaults and no `[routing.tokenizers]`: the simulated
SGLang workers (32k-token caches) count tokens with a tokenizer the gateway is not given, and
`--offer-tokenizer` sets how much of it they let a router find (see `sim_engine`): `none` leaves the
gateway UTF-8 bytes and the bytes per token it learns from the workers' `prompt_tokens`.
`--sim-tokenizer bpe` swaps the word-level vocabulary for the embedded model's BPE one (SmolLM2's,
from its GGUF), under which a word is several tokens. `--seed`, `--groups` and `--concurrency` vary
what the workloads fix. `offline.py` replays the same workloads through the gateway's pool in
simulated time, in-process (deterministic, seconds per workload; no sglang-router).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from adapters.local.config import default_model_path
from benchmarks.routing.cluster import (
    Cluster,
    Proc,
    cpu_seconds,
    flush_workers,
    worker_counters,
)
from benchmarks.routing.decision import measure_decisions
from benchmarks.routing.load import RunResult, run_conversations, run_requests
from benchmarks.routing.report import Cpu, Row, markdown, median_rows, summarize
from benchmarks.routing.sim_core import SimConfig
from benchmarks.routing.workload import (
    generated_shared_prefix,
    multi_turn,
    no_sharing,
    skewed_popularity,
    write_word_tokenizer,
)

POLICIES = ("round_robin", "random", "power_of_two", "least_load", "session", "cache_aware")
WORKERS = 4
SYSTEM_LEN, QUESTION_LEN, OUTPUT_LEN = 2048, 128, 256
CAPACITY_TOKENS = 32_768
"""Each worker's KV pool: 16 system prompts, with nothing left for questions and outputs (the
shared-prefix workload's 64 prompts need all four workers' caches and a little more)."""
CONCURRENCY = 64
DEFAULT_SEED = 7
DEFAULT_GROUPS = 64
BPE_WORDS_SCALE = 0.5
"""Under the BPE vocabulary a workload word is about two tokens: half the words, about the same tokens."""
TURNS = 5
CONVERSATIONS = 208
"""Multi-turn: 208 conversations x 5 turns = 1,040 requests, so TTFT p99 is the 11th slowest first
token (with 240 requests it was the 3rd: one collision moved it)."""
USERS = 48
"""Multi-turn: conversations in progress at once (a user starts another when one ends)."""
USERS_RAMP_S = 2.5
"""Multi-turn: the users start spread over this many simulated seconds (about one turn: 128 decode
steps), as users arrive in production. Started all at once, they stay in lockstep: every turn of
every conversation on a worker lands in the same instant, and the first 48 requests all hit a cold
cluster together; with 1,040 requests those synchronized bursts, not the routing, made the p99."""
OUT = Path(__file__).parent / "out"


@dataclass(frozen=True, slots=True)
class Shape:
    """What a run fixes about its workloads (vary it to check a policy is not tuned to one)."""

    seed: int = DEFAULT_SEED
    groups: int = DEFAULT_GROUPS
    """Shared-prefix and skewed: distinct system prompts."""
    concurrency: int = CONCURRENCY
    """Requests in flight (shared prefix, skewed, no sharing)."""
    words_scale: float = 1.0
    """Shrinks the prompts' word counts (a BPE vocabulary makes each word several tokens: 0.5
    keeps its prompts near the word-level sizes in tokens)."""


async def replay(
    workload: str, target: Callable[[int], str], session_ids: bool, time_scale: float, shape: Shape
) -> RunResult:
    """Replay one workload."""
    seed, groups, concurrency = shape.seed, shape.groups, shape.concurrency
    system, question = round(SYSTEM_LEN * shape.words_scale), round(QUESTION_LEN * shape.words_scale)
    if workload == "shared_prefix":
        requests = generated_shared_prefix(
            seed, groups=groups, system_len=system, question_len=question, output_len=OUTPUT_LEN
        )
        return await run_requests(requests, target, concurrency, user_ids=session_ids)
    if workload == "skewed":
        requests = skewed_popularity(
            seed, groups=groups, system_len=system, question_len=question, output_len=OUTPUT_LEN
        )
        return await run_requests(requests, target, concurrency, user_ids=session_ids)
    if workload == "no_sharing":
        requests = no_sharing(seed, prompt_len=system + question, output_len=OUTPUT_LEN)
        return await run_requests(requests, target, concurrency, user_ids=session_ids)
    conversations = multi_turn(
        seed,
        conversations=CONVERSATIONS,
        turns=TURNS,
        system_len=system,
        question_len=question,
        output_len=OUTPUT_LEN // 2,
    )
    return await run_conversations(conversations, TURNS, target, USERS, USERS_RAMP_S * time_scale)


def router_trees(router: Proc) -> list[dict[str, object]]:
    """Tree size, memory and prediction accuracy per worker, as the gateway's admin API reports them."""
    keys = (
        "tree_tokens",
        "tree_nodes",
        "tree_memory_bytes",
        "capacity_tokens",
        "capacity_estimate_tokens",
        "predicted_cached_tokens",
        "reported_cached_tokens",
        "mispredictions",
        "requests",
    )
    rows = httpx.get(router.url + "/admin/workers", timeout=10, trust_env=False).json()["workers"]
    return [
        {"id": row["id"], **{key: row[key] for key in keys}, "kv_events": _feed(row["kv_events"])}
        for row in rows
    ]


def _feed(status: dict[str, object] | None) -> dict[str, object] | None:
    """Where a worker's KV-event feed came from and what it saw (None: no feed)."""
    keys = ("source", "live", "blocks", "events", "replayed", "resets")
    return None if status is None else {key: status[key] for key in keys}


def _fixed(url: str) -> Callable[[int], str]:
    """Every request to one URL (a router's)."""
    return lambda _group: url


def _cpu(router: Proc | None, workers: Sequence[Proc]) -> Cpu:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Cpu(
        router=cpu_seconds(router) if router is not None else None,
        workers=sum(cpu_seconds(w) for w in workers),
        client=usage.ru_utime + usage.ru_stime,
    )


def run_one(
    workload: str,
    name: str,
    router: Proc | None,
    workers: Sequence[Proc],
    target: Callable[[int], str],
    time_scale: float,
    shape: Shape,
) -> Row:
    flush_workers(workers)
    before, cpu_before = [worker_counters(w) for w in workers], _cpu(router, workers)
    result = asyncio.run(replay(workload, target, True, time_scale, shape))
    after, cpu_after = [worker_counters(w) for w in workers], _cpu(router, workers)
    cpu = Cpu(
        router=None
        if cpu_after.router is None or cpu_before.router is None
        else cpu_after.router - cpu_before.router,
        workers=cpu_after.workers - cpu_before.workers,
        client=cpu_after.client - cpu_before.client,
    )
    row = summarize(workload, name, result, [a.minus(b) for a, b in zip(after, before, strict=True)], cpu)
    if router is not None and name.startswith("radixgate"):
        row.trees = router_trees(router)
    print(json.dumps(asdict(row)), flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the workloads' prompts and order")
    parser.add_argument(
        "--sglang-router",
        type=Path,
        default=Path(sys.executable),
        help="python with sglang-router installed (the `bench` extra; skipped if it lacks it)",
    )
    parser.add_argument(
        "--workloads", nargs="+", default=["shared_prefix", "multi_turn", "skewed", "no_sharing"]
    )
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--offer-tokenizer", choices=("path", "tokenize", "none"), default="none")
    parser.add_argument("--sim-tokenizer", choices=("word", "bpe"), default="word")
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="workers publish KV events; gateways find them in /server_info and subscribe",
    )
    parser.add_argument(
        "--kv-events-configured",
        action="store_true",
        help="with --kv-events: name each worker's event sockets in the gateways' config instead",
    )
    parser.add_argument("--gateway-toml", default="", help="extra radixgate.toml lines for every gateway")
    parser.add_argument("--stream-interval", type=int, default=64)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=TOML: one more cache_aware gateway with extra settings (\\n for newlines)",
    )
    parser.add_argument("--groups", type=int, default=DEFAULT_GROUPS)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="replay each workload this many times per router, taking turns; the table gives medians",
    )
    parser.add_argument("--skip-decision", action="store_true", help="skip the decision-latency measurement")
    args = parser.parse_args(argv)
    args.kv_events = args.kv_events or args.kv_events_configured
    OUT.mkdir(exist_ok=True)
    words_scale = 1.0 if args.sim_tokenizer == "word" else BPE_WORDS_SCALE
    shape = Shape(args.seed, args.groups, args.concurrency, words_scale)
    word_tokenizer = write_word_tokenizer(OUT / "tokenizer.json")
    tokenizer = word_tokenizer if args.sim_tokenizer == "word" else default_model_path()
    gateway_config = OUT / "gateway.toml"
    # Routing defaults, no tokenizer named. Health checks must not mistake a saturated (simulated,
    # two-core) engine for a dead one: that timeout is the host's, not the routing's.
    gateway_config.write_text("[upstream_client]\nhealth_timeout_s = 10.0\n" + args.gateway_toml)
    config = SimConfig(
        capacity_tokens=CAPACITY_TOKENS, time_scale=args.time_scale, stream_interval=args.stream_interval
    )
    gateway_env: dict[str, str] = {}
    cluster = Cluster(OUT)
    rows: list[Row] = []
    started = time.time()
    try:
        event_ports = [cluster.event_ports() if args.kv_events else 0 for _ in range(WORKERS)]
        workers = [
            cluster.sim_worker(i, config, tokenizer, args.offer_tokenizer, event_ports[i])
            for i in range(WORKERS)
        ]
        cluster.wait_ready(workers)
        routed = workers
        if args.kv_events_configured:  # the workers and their event sockets go in the gateway's config
            gateway_config.write_text(gateway_config.read_text() + _workers_toml(workers, event_ports))
            routed = []
        for workload in args.workloads:
            routers = [
                cluster.gateway(f"radixgate-{policy}", routed, policy, gateway_config, gateway_env)
                for policy in args.policies
            ]
            for variant in args.variant:
                name, _, extra = variant.partition("=")
                variant_config = OUT / f"gateway-{name}.toml"
                variant_config.write_text(gateway_config.read_text() + extra.replace("\\n", "\n") + "\n")
                routers.append(
                    cluster.gateway(
                        f"radixgate-cache_aware-{name}", routed, "cache_aware", variant_config, gateway_env
                    )
                )
            if _has_sglang_router(args.sglang_router):
                routers.append(
                    cluster.sglang_router(
                        "sglang-router-cache_aware", workers, args.sglang_router, word_tokenizer
                    )
                )
            cluster.wait_ready(routers)
            for _ in range(args.rounds):  # the routers take turns, so a slow spell of the host hits all
                for router in routers:
                    target = _fixed(router.url)
                    rows.append(
                        run_one(workload, router.name, router, workers, target, args.time_scale, shape)
                    )
                rows.append(
                    run_one(
                        workload,
                        "oracle-sticky",
                        None,
                        workers,
                        lambda group: workers[group % len(workers)].url,
                        args.time_scale,
                        shape,
                    )
                )
            cluster.stop(routers)
    finally:
        cluster.stop()
    decisions = {} if args.skip_decision else measure_decisions()
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.system()}".strip(),
        "sim": asdict(config),
        "offer_tokenizer": args.offer_tokenizer,
        "sim_tokenizer": args.sim_tokenizer,
        "kv_events": args.kv_events and ("configured" if args.kv_events_configured else "discovered"),
        "shape": asdict(shape),
        "rounds": args.rounds,
        "rows": [asdict(r) for r in median_rows(rows)],
        "round_rows": [asdict(r) for r in rows] if args.rounds > 1 else None,
        "decision": decisions,
        "wall_s": round(time.time() - started, 1),
    }
    (OUT / "results.json").write_text(json.dumps(report, indent=2))
    print(markdown(median_rows(rows)))
    print(json.dumps(decisions, indent=2))


def _workers_toml(workers: Sequence[Proc], event_ports: Sequence[int]) -> str:
    """`[[workers]]` entries naming each worker's KV-event sockets."""
    lines = []
    for worker, port in zip(workers, event_ports, strict=True):
        lines += [
            "",
            "[[workers]]",
            f'url = "{worker.url}"',
            'kind = "sglang"',
            f'kv_events = {{ endpoint = "tcp://127.0.0.1:{port}", '
            f'replay_endpoint = "tcp://127.0.0.1:{port + 1}" }}',
        ]
    return "\n".join(lines) + "\n"


def _has_sglang_router(python: Path) -> bool:
    if not python.exists():
        return False
    probe = subprocess.run([str(python), "-c", "import sglang_router"], capture_output=True, check=False)
    return probe.returncode == 0


if __name__ == "__main__":
    main()
