"""Radix tree latency: match and insert of an 8k-token prompt in a tree holding 1M tokens; a 32k match.

Run: ``.venv/bin/python -m benchmarks.cache.bench_radix`` (prints a Markdown table).

Two tree shapes, both grown to ~1M tokens of random ids from a 150k vocabulary:

- ``shared-prefix``: 8,192-token prompts = one of 16 system prompts (2,048 tokens) + a unique tail
  (few, long nodes: the engine's and the router's common case);
- ``multi-turn``: conversations grown turn by turn (256-token turns), each conversation inserted
  after every turn (deep paths of short nodes: the worst case for per-node overhead).

and ``shared-prefix 32k``: 32,768-token prompts on the same 16 system prompts, ~1M tokens in all.

The baseline, measured in the same run on the same trees, is the textbook radix tree with tuple keys
compared token by token in a Python loop. Latencies are wall-clock p50/p99 plus p99 thread-CPU time,
since on a shared machine wall p99 also counts time the scheduler gave to other processes.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from array import array
from collections.abc import Callable, Sequence

from cachelayer.radix import RadixTree

VOCAB = 150_000
TARGET_TOKENS = 1_000_000


class NaiveRadix:
    """Baseline: tuple keys, per-token comparison loop, no paging, no locks."""

    def __init__(self) -> None:
        self.root: dict[int, tuple[tuple[int, ...], dict[int, object]]] = {}

    def match(self, tokens: Sequence[int]) -> int:
        children, pos = self.root, 0
        while pos < len(tokens) and tokens[pos] in children:
            key, grandchildren = children[tokens[pos]]
            common = 0
            while common < len(key) and pos + common < len(tokens) and key[common] == tokens[pos + common]:
                common += 1
            pos += common
            if common < len(key):
                break
            children = grandchildren  # type: ignore[assignment]
        return pos

    def insert(self, tokens: Sequence[int]) -> None:
        children, pos = self.root, 0
        while pos < len(tokens):
            entry = children.get(tokens[pos])
            if entry is None:
                children[tokens[pos]] = (tuple(tokens[pos:]), {})
                return
            key, grandchildren = entry
            common = 0
            while common < len(key) and pos + common < len(tokens) and key[common] == tokens[pos + common]:
                common += 1
            if common < len(key):
                head: dict[int, object] = {key[common]: (key[common:], grandchildren)}
                children[tokens[pos]] = (key[:common], head)
                grandchildren = head
            pos += common
            children = grandchildren  # type: ignore[assignment]


def shared_prefix_corpus(rng: random.Random, length: int) -> list[list[int]]:
    systems = [[rng.randrange(VOCAB) for _ in range(2048)] for _ in range(16)]
    corpus, total = [], 0
    while total < TARGET_TOKENS:
        tail = [rng.randrange(VOCAB) for _ in range(length - 2048)]
        corpus.append(rng.choice(systems) + tail)
        total += len(tail)
    return corpus


def multi_turn_corpus(rng: random.Random) -> list[list[int]]:
    system = [rng.randrange(VOCAB) for _ in range(1024)]
    corpus, total = [], 0
    while total < TARGET_TOKENS:
        conversation = list(system)
        for _ in range(rng.randrange(8, 28)):  # up to 1,024 + 27 x 256 ~ 8k tokens
            conversation += [rng.randrange(VOCAB) for _ in range(256)]
            corpus.append(list(conversation))
            total += 256
    return corpus


def timed(action: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """(p50, p99) wall ms and p99 thread-CPU ms: on a shared machine, wall p99 also counts time the
    scheduler gave to other processes; CPU time is what the operation itself cost."""
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.thread_time()
        action()
        cpu.append(time.thread_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    wall.sort()
    cpu.sort()
    p99 = min(runs - 1, int(runs * 0.99))
    return statistics.median(wall) * 1e3, wall[p99] * 1e3, cpu[p99] * 1e3


def build(corpus: list[list[int]], page_size: int) -> tuple[RadixTree[None], float]:
    """The tree over ``corpus`` and the MiB its build allocated (tracemalloc, build only)."""
    gc.unfreeze()  # let the previous shape's trees and corpus go
    gc.collect()
    tracemalloc.start()
    tree: RadixTree[None] = RadixTree(page_size=page_size)
    for sequence in corpus:
        tree.insert(sequence)
    mib = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    return tree, mib


def settle() -> None:
    """Collect once, then exempt everything built so far from GC (as a server does after start-up),
    so full collections of the corpus's million int objects do not land inside timed operations."""
    gc.collect()
    gc.freeze()


def bench_shape(
    name: str, corpus: list[list[int]], rng: random.Random, runs: int, page_size: int
) -> list[str]:
    tree, tree_mib = build(corpus, page_size)
    naive = NaiveRadix()
    for sequence in corpus:
        naive.insert(sequence)
    hits = [rng.choice(corpus) for _ in range(runs)]
    hits = [h + [rng.randrange(VOCAB) for _ in range(8192 - len(h))] for h in hits]  # pad short turns to 8k
    fresh = [[*rng.choice(corpus)[:2048], *(rng.randrange(VOCAB) for _ in range(6144))] for _ in range(runs)]
    size = (tree.total_tokens, tree.node_count, tree_mib)
    settle()
    rows = []
    queue = iter(hits)
    ours = timed(lambda: tree.match_prefix(next(queue)), runs)
    queue = iter(hits)
    base = timed(lambda: naive.match(next(queue)), runs)
    rows.append(_row(name, page_size, "match 8k (cached prefix)", size, ours, base))
    queue = iter(fresh)
    ours = timed(lambda: tree.insert(next(queue)), runs)
    queue = iter(fresh)
    base = timed(lambda: naive.insert(next(queue)), runs)
    rows.append(_row(name, page_size, "insert 8k (2k shared + 6k new)", size, ours, base))
    return rows


def bench_long(rng: random.Random, runs: int, page_size: int) -> list[str]:
    corpus = shared_prefix_corpus(rng, 32_768)
    tree, tree_mib = build(corpus, page_size)
    naive = NaiveRadix()
    for sequence in corpus:
        naive.insert(sequence)
    queries = [rng.choice(corpus) for _ in range(runs)]
    settle()
    queue = iter(queries)
    ours = timed(lambda: tree.match_prefix(next(queue)), runs)
    queue = iter(queries)
    base = timed(lambda: naive.match(next(queue)), runs)
    size = (tree.total_tokens, tree.node_count, tree_mib)
    rows = [_row("shared-prefix 32k", page_size, "match 32k (cached prefix)", size, ours, base)]
    packed = iter([array("I", query) for query in queries])  # the caller converted once, e.g. for N trees
    ours = timed(lambda: tree.match_prefix(next(packed)), runs)
    rows.append(_row("shared-prefix 32k", page_size, "match 32k, array('I') input", size, ours, base))
    return rows


def _row(
    shape: str,
    page: int,
    op: str,
    size: tuple[int, int, float],
    ours: tuple[float, float, float],
    base: tuple[float, float, float],
) -> str:
    tokens, nodes, mib = size
    return (
        f"| {shape} | {page} | {op} | {tokens:,} | {nodes:,} | {mib:.1f} "
        f"| {ours[0]:.3f} | {ours[1]:.3f} | {ours[2]:.3f} | {base[0]:.3f} | {base[1]:.3f} "
        f"| {base[0] / ours[0]:.1f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=500, help="timed operations per row")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(
        "| tree | page | operation | tree tokens | nodes | tree MiB | p50 ms | p99 ms | p99 CPU ms "
        "| baseline p50 ms | baseline p99 ms | p50 speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for page_size in (1, 16):
        for row in bench_shape("shared-prefix", shared_prefix_corpus(rng, 8192), rng, args.runs, page_size):
            print(row, flush=True)
        for row in bench_shape("multi-turn", multi_turn_corpus(rng), rng, args.runs, page_size):
            print(row, flush=True)
        for row in bench_long(rng, args.runs, page_size):
            print(row, flush=True)


if __name__ == "__main__":
    main()
