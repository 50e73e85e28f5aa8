"""The routing benchmark's workloads through the gateway's own `WorkerPool`, in simulated time, in-process.

    .venv/bin/python -m benchmarks.routing.offline [--workloads shared_prefix no_sharing] [--seed 7]

The same simulated engines as `bench` (`sim_core.SimEngine`'s cache, admission and retirement), the
same workloads and the same closed-loop clients, but driven by one discrete-event clock instead of
HTTP and wall time: no process, no socket, no host noise. The gateway's pool decides with its shipped
routing defaults and no tokenizer configured (it routes on UTF-8 bytes and learns bytes per token
from the engines' reported prompt tokens, as in `bench --offer-tokenizer none`), and its leases are
released with the engines' own usage. A run of every workload takes seconds, and the same seed gives
the same figures, so a change to the policy can be judged to a fraction of a point before the timed
`bench` confirms it against sglang-router. Not modelled: HTTP and streaming latency, the gateway's
CPU, sglang-router (it runs only in `bench`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field

import msgspec

from adapters.base import Completion, EngineRequest, RouteHint
from adapters.local.config import default_model_path
from adapters.schema import ChatCompletionRequest, ChatMessage, PromptTokensDetails, Usage
from benchmarks.responses import affinity
from benchmarks.routing.bench import (
    BPE_WORDS_SCALE,
    CAPACITY_TOKENS,
    CONCURRENCY,
    CONVERSATIONS,
    OUT,
    OUTPUT_LEN,
    QUESTION_LEN,
    SYSTEM_LEN,
    TURNS,
    USERS,
    USERS_RAMP_S,
    WORKERS,
)
from benchmarks.routing.offline_cluster import Job, OfflineCluster
from benchmarks.routing.sim_core import SimConfig
from benchmarks.routing.sim_tokens import SimTokens
from benchmarks.routing.workload import (
    Conversation,
    Request,
    generated_shared_prefix,
    multi_turn,
    no_sharing,
    skewed_popularity,
    write_word_tokenizer,
)
from proxy.routing.config import RoutingSettings, WorkerSpec
from proxy.routing.pool import WorkerPool
from proxy.routing.tokenizing import ChatRenderer, load_chat_template, load_tokenizer
from proxy.telemetry.prometheus import METRIC_PREFIX, MetricsRegistry
from proxy.telemetry.semconv import ROUTING_DECISIONS_METRIC

MODEL = "sim-model"
POLICIES = ("round_robin", "cache_aware", "oracle")
DEFAULT_JITTER_S = 0.02
"""Up to 20 simulated ms between a request's end and its client's next request: at time scale 0.1,
the 2 ms of a gateway hop and the event loops' scheduling on a loaded host."""


class _NoEngine:
    """The pool's engine for a simulated worker: never called (requests go to the SimEngine)."""

    provider_name = "sim"
    server_address = "127.0.0.1"
    server_port: int | None = None

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec

    async def complete(self, request: EngineRequest) -> Completion:
        raise NotImplementedError("offline workers are driven by the event loop, not called")

    async def stream(self, request: EngineRequest) -> AsyncIterator[bytes]:
        raise NotImplementedError("offline workers are driven by the event loop, not called")
        yield b""

    async def check_health(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


@dataclass(slots=True)
class Result:
    workload: str
    router: str
    hit_rate: float
    throughput: float
    """Output tokens per simulated second until the last request ended."""
    engine_throughput: float
    """Output tokens per simulated busy second of the busiest worker (as `bench` reports it)."""
    per_worker_requests: list[int]
    ttft_p99_s: float
    reasons: dict[str, int] = field(default_factory=dict)
    kept: float | None = None
    """Hinted runs: the share of hinted turns that stayed on their previous turn's worker."""


def _engine_request(messages: list[dict[str, str]], max_tokens: int, user: str | None) -> EngineRequest:
    params = ChatCompletionRequest(
        model=MODEL,
        messages=[ChatMessage(role=m["role"], content=m["content"]) for m in messages],
        max_tokens=max_tokens,
        user=user,
    )
    return EngineRequest(
        operation="chat",
        params=params,
        raw_body=msgspec.json.encode(params),
        request_id="r",
        tenant_id="t",
        cache_salt="",
    )


class Replay:
    """One router over one workload: the pool (or the sticky oracle) chooses, the cluster runs."""

    def __init__(
        self,
        router: str,
        tokens: SimTokens,
        config: SimConfig,
        toml: dict[str, object],
        jitter_s: float,
        seed: int,
    ) -> None:
        self.router = router
        self.tokens = tokens
        self.cluster = OfflineCluster(config, WORKERS, jitter_s, seed)
        specs = [
            WorkerSpec(kind="sglang", url=f"http://127.0.0.1:{9000 + i}", id=f"w{i}", models=[MODEL])
            for i in range(WORKERS)
        ]
        policy = "cache_aware" if router.startswith(("oracle", "hinted")) else router.split(":")[0]
        settings = msgspec.convert({**toml, "policy": policy}, RoutingSettings)
        self.metrics = MetricsRegistry()
        self.pool = WorkerPool(
            [MODEL],
            specs,
            settings,
            engine_factory=_NoEngine,
            metrics=self.metrics,
            clock=lambda: self.cluster.now,
        )
        for worker in self.pool.workers():
            worker.set_capacity(config.capacity_tokens, "engine")
        self.index = {w.id: i for i, w in enumerate(self.pool.workers())}
        self.ttfts: list[float] = []
        self.outputs = 0
        self.hinted = self.kept = 0
        self.hint = router.startswith("hinted")
        """Each turn after a conversation's first names the previous turn's worker (`RouteHint`)."""

    async def send(
        self,
        messages: list[dict[str, str]],
        max_tokens: int,
        group: int,
        user: str | None,
        done: Callable[[Job], Awaitable[None]],
        prefer: str | None = None,
    ) -> str:
        """Route and submit one request; the id of the worker it went to."""
        prompt = self.tokens.chat([ChatMessage(role=m["role"], content=m["content"]) for m in messages])
        lease = None
        if self.router == "oracle":
            worker = group % WORKERS
        else:
            engine_request = _engine_request(messages, max_tokens, user)
            if prefer is not None:
                engine_request.route = RouteHint(prefer_worker=prefer)
            lease = await self.pool.acquire(engine_request)
            worker = self.index[lease.worker_id]
            if prefer is not None:
                self.hinted += 1
                self.kept += lease.worker_id == prefer
        request = self.cluster.engines[worker].submit(prompt, max_tokens, self.tokens.output_vocab)
        self.cluster.submit(worker, Job(request, lease, self.cluster.now, done))
        return f"w{worker}"

    def finish(self, job: Job) -> str:
        """Account a finished job and release its lease with the engine's usage; its answer text."""
        request = job.request
        self.outputs += len(request.output)
        if job.first_token is not None:
            self.ttfts.append(job.first_token - job.sent)
        if job.lease is not None:
            usage = Usage(
                prompt_tokens=len(request.prompt),
                completion_tokens=len(request.output),
                prompt_tokens_details=PromptTokensDetails(cached_tokens=request.cached_tokens),
            )
            job.lease.release(usage=usage, failed=False)
        return self.tokens.detokenize(request.output)

    def reasons(self) -> dict[str, int]:
        """The pool's routing decisions by reason, from its own decisions counter."""
        counts: dict[str, int] = {}
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == METRIC_PREFIX + ROUTING_DECISIONS_METRIC:
                    reason = sample.labels["reason"]
                    counts[reason] = counts.get(reason, 0) + int(sample.value)
        return dict(sorted(counts.items()))

    def result(self, workload: str) -> Result:
        stats = [e.stats for e in self.cluster.engines]
        prompt = sum(s.prompt_tokens for s in stats)
        ttfts = sorted(self.ttfts)
        return Result(
            workload=workload,
            router=self.router,
            hit_rate=round(sum(s.cached_tokens for s in stats) / prompt, 4),
            throughput=round(self.outputs / self.cluster.now, 1),
            engine_throughput=round(self.outputs / max(s.busy_s for s in stats), 1),
            per_worker_requests=[s.requests for s in stats],
            ttft_p99_s=round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 3),
            reasons=self.reasons(),
            kept=round(self.kept / self.hinted, 4) if self.hinted else None,
        )


async def replay_requests(replay: Replay, requests: Sequence[Request], concurrency: int) -> None:
    """`concurrency` clients, each sending the next request when its last one is answered."""
    queue = list(reversed(requests))

    async def next_one(job: Job | None = None) -> None:
        if job is not None:
            replay.finish(job)
        if queue:
            request = queue.pop()
            await replay.send(
                request.messages, request.max_tokens, request.group, f"group-{request.group}", next_one
            )

    for _ in range(concurrency):
        await next_one()
    await replay.cluster.run()


async def replay_conversations(
    replay: Replay, conversations: Sequence[Conversation], users: int, ramp_s: float
) -> None:
    """`users` users chatting at once, each taking the next conversation when one ends; user i starts
    `ramp_s * i / users` after the first."""
    queue = list(reversed(conversations))

    async def start(conversation: Conversation) -> None:
        turn = 0
        worker: str | None = None

        async def answered(job: Job) -> None:
            nonlocal turn
            conversation.answered(turn, replay.finish(job))
            turn += 1
            if turn < len(conversation.questions):
                await send()
            elif queue:
                await start(queue.pop())

        async def send() -> None:
            nonlocal worker
            request = conversation.turn(turn)
            prefer = worker if replay.hint else None
            worker = await replay.send(
                request.messages,
                request.max_tokens,
                conversation.group,
                f"conv-{conversation.group}",
                answered,
                prefer,
            )

        await send()

    starts = [(ramp_s * i / users, i) for i in range(min(users, len(conversations)))]
    for at, _ in starts:
        replay.cluster.now = at
        await start(queue.pop())
    replay.cluster.now = 0.0
    await replay.cluster.run()


def workload_of(name: str, seed: int, groups: int, scale: float = 1.0) -> list[Request] | list[Conversation]:
    """One of `bench`'s workloads; `scale` shrinks its word counts (as `bench --sim-tokenizer bpe`)."""
    system, question = round(SYSTEM_LEN * scale), round(QUESTION_LEN * scale)
    if name == "shared_prefix":
        return generated_shared_prefix(
            seed, groups=groups, system_len=system, question_len=question, output_len=OUTPUT_LEN
        )
    if name == "skewed":
        return skewed_popularity(
            seed, groups=groups, system_len=system, question_len=question, output_len=OUTPUT_LEN
        )
    if name == "no_sharing":
        return no_sharing(seed, prompt_len=system + question, output_len=OUTPUT_LEN)
    return multi_turn(
        seed,
        conversations=CONVERSATIONS,
        turns=TURNS,
        system_len=system,
        question_len=question,
        output_len=OUTPUT_LEN // 2,
    )


async def run_one(workload: str, router: str, args: argparse.Namespace, tokens: SimTokens) -> Result:
    toml = json.loads(args.settings.get(router.partition(":")[2], "{}")) if ":" in router else {}
    if workload == "affinity":  # `benchmarks.responses.affinity`'s conversations, its tokenizer given
        config = SimConfig(capacity_tokens=affinity.CAPACITY_TOKENS)
        toml = {**toml, "tokenizers": {MODEL: str(args.tokenizer)}}
        replay = Replay(router, tokens, config, toml, args.jitter_s, args.seed)
        conversations = multi_turn(
            args.seed,
            conversations=affinity.DEFAULT_CONVERSATIONS,
            turns=affinity.TURNS,
            system_len=affinity.SYSTEM_LEN,
            question_len=affinity.QUESTION_LEN,
            output_len=affinity.OUTPUT_LEN,
        )
        await replay_conversations(replay, conversations, affinity.USERS, 0.0)
        return replay.result(workload)
    config = SimConfig(capacity_tokens=CAPACITY_TOKENS)
    replay = Replay(router, tokens, config, toml, args.jitter_s, args.seed)
    items = workload_of(workload, args.seed, args.groups, args.words_scale)
    if workload == "multi_turn":
        await replay_conversations(replay, items, USERS, USERS_RAMP_S)  # type: ignore[arg-type]
    else:
        await replay_requests(replay, items, args.concurrency)  # type: ignore[arg-type]
    return replay.result(workload)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workloads", nargs="+", default=["shared_prefix", "multi_turn", "skewed", "no_sharing"]
    )
    parser.add_argument(
        "--routers",
        nargs="+",
        default=list(POLICIES),
        help="policy names, `oracle`, or POLICY:NAME for a variant given by --setting",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        help="NAME=JSON: [routing] settings of the variant POLICY:NAME",
    )
    parser.add_argument("--sim-tokenizer", choices=("word", "bpe"), default="word")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument(
        "--jitter-s",
        type=float,
        default=DEFAULT_JITTER_S,
        help="simulated seconds of random delay before a client sees its answer",
    )
    args = parser.parse_args(argv)
    args.settings = dict(s.partition("=")[::2] for s in args.setting)
    OUT.mkdir(exist_ok=True)
    path = args.tokenizer = write_word_tokenizer(OUT / "tokenizer.json")
    engine_tokenizer = str(path) if args.sim_tokenizer == "word" else str(default_model_path())
    tokens = SimTokens(load_tokenizer(engine_tokenizer), ChatRenderer(load_chat_template(engine_tokenizer)))
    args.words_scale = 1.0 if args.sim_tokenizer == "word" else BPE_WORDS_SCALE
    for workload in args.workloads:
        for router in args.routers:
            result = asyncio.run(run_one(workload, router, args, tokens))
            print(json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    main()
