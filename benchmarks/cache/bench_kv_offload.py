"""KV offload in the embedded engine: TTFT of a 2,048-token prefix + a short question, cold vs. reloaded.

Run: ``.venv/bin/python -m benchmarks.cache.bench_kv_offload`` (prints a Markdown table).

One run, one model (SmolLM2-135M-Instruct, fp32), one engine configuration: a KV pool that holds one
prompt (2,304 tokens), so each new prompt evicts the previous one into the offload store.

1. cold: each prompt (a distinct 2,048-token prefix + the same 16-token question, seeded random ids)
   computed from scratch; every one but the first evicts its predecessor into L2 (memory) and, via
   the writer thread, L3 (`DIR/kv` style directory in a temporary folder).
2. L2 hit: each prompt again, its pages loaded back from memory (the other prompt evicted it).
3. L3 hit: the engine closed and a new one opened on the same directory (a restart: memory is empty);
   each prompt again, loaded from disk. For the first prompts the page files are first dropped from
   the OS page cache (``posix_fadvise(DONTNEED)`` after they were fsync'ed), so the read comes from
   the device; the last one reads files the page cache may still hold.

TTFT = submission to the first generated token (max_tokens 1, greedy); every reloaded answer's first
token is checked against the cold one. Floors (issue #4): L2 <= 1/8 and L3 <= 1/4 of cold TTFT.
For reference, the last prompt also runs once more while its pages are still in the pool (an
ordinary radix hit, no load), and each row says how much of its time the engine thread spent
offloading the pages its admission evicted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from adapters.local import LocalEngineConfig
from adapters.local.engine import LocalEngine
from adapters.local.loader import LoadedModel, load_model
from adapters.local.offload import L2_TIER, L3_TIER
from benchmarks.engine.workloads import greedy, token_ids

PREFIX_TOKENS = 2048
QUESTION_TOKENS = 16
L2_FLOOR = 1 / 8
L3_FLOOR = 1 / 4


async def first_token(engine: LocalEngine, prompt: list[int]) -> tuple[float, int, int]:
    """(TTFT seconds, first token id, cached prompt tokens) of one greedy one-token request."""
    start = time.perf_counter()
    ttft, token, cached = 0.0, -1, 0
    async for deltas in engine.generate_stream(prompt, greedy(1)):
        for delta in deltas:
            if token < 0:
                ttft, token = time.perf_counter() - start, delta.token_id
            cached = max(cached, delta.cached_tokens)
    return ttft, token, cached


def drop_page_cache(directory: Path) -> int:
    """Ask the kernel to forget the cached pages of every page file; returns the files touched."""
    files = [path for path in directory.rglob("*") if path.is_file() and path.name != ".lock"]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(files)


def tier_hits(engine: LocalEngine, name: str) -> int:
    stats = engine.kv_offload_stats()
    assert stats is not None
    return next(t.hits for t in stats.store.tiers if t.name == name)


@dataclass(slots=True)
class Row:
    label: str
    prompt: int
    ttft_s: float
    first_token: int
    cached: int
    evict_s: float
    """Engine-thread time this request spent offloading the pages it evicted."""


def measure(engine: LocalEngine, label: str, index: int, prompt: list[int]) -> Row:
    """One request, with the offload time it caused (read from the engine's live counters)."""
    before = engine.kv_offload_stats()
    ttft, token, cached = asyncio.run(first_token(engine, prompt))
    after = engine.kv_offload_stats()
    assert before is not None and after is not None
    return Row(label, index, ttft, token, cached, after.offload_seconds - before.offload_seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3, help="distinct prefixes (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    question = token_ids(QUESTION_TOKENS, seed=999)
    prompts = [token_ids(PREFIX_TOKENS, seed=seed) + question for seed in range(args.prompts)]
    base = LocalEngineConfig(threads=args.threads, kv_budget_tokens=PREFIX_TOKENS + 256, kv_offload=True)
    model: LoadedModel = load_model(base)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="radixgate-kv-bench-") as folder:
        config = replace(base, kv_offload_dir=Path(folder))
        engine = LocalEngine(config, model=model)
        engine.start_sync()
        for index, prompt in enumerate(prompts):
            rows.append(measure(engine, "cold", index, prompt))
        for index, prompt in enumerate(prompts):
            rows.append(measure(engine, "L2 hit (memory)", index, prompt))
        last = len(prompts) - 1
        rows.append(measure(engine, "pool hit (pages never left the pool)", last, prompts[last]))
        l2_hits = tier_hits(engine, L2_TIER)
        before_restart = engine.kv_offload_stats()
        engine.close_sync()  # drains the L3 writer: every evicted page is on disk

        restarted = LocalEngine(config, model=model)
        restarted.start_sync()
        dropped = 0
        for index, prompt in enumerate(prompts):
            if index < last:
                dropped = drop_page_cache(Path(folder))
            label = "L3 hit (disk, page cache warm)" if index == last else "L3 hit (disk, page cache dropped)"
            rows.append(measure(restarted, label, index, prompt))
        l3_hits = tier_hits(restarted, L3_TIER)
        after_restart = restarted.kv_offload_stats()
        restarted.close_sync()
    cold_tokens = {row.prompt: row.first_token for row in rows if row.label == "cold"}
    assert all(row.first_token == cold_tokens[row.prompt] for row in rows), (
        "a reloaded prefix changed the answer"
    )
    assert before_restart is not None and after_restart is not None
    report(rows, l2_hits, l3_hits, dropped)
    print(
        f"eviction: {before_restart.offloaded_pages} pages offloaded in "
        f"{before_restart.offload_seconds * 1000:.0f} ms of engine-thread time "
        f"({before_restart.offload_seconds * 1000 / max(before_restart.offloaded_pages, 1):.2f} ms/page)"
    )
    rates = (*before_restart.load_bytes_per_s, *after_restart.load_bytes_per_s)
    print("measured load speed (running estimate): " + ", ".join(f"{n} {r / 1e6:.0f} MB/s" for n, r in rates))


def report(rows: list[Row], l2_hits: int, l3_hits: int, dropped: int) -> None:
    print("| run | prompt | cached prompt tokens | TTFT ms | of which offloading evicted pages, ms |")
    print("|---|---|---|---|---|")
    for row in rows:
        ms = f"{row.ttft_s * 1000:.1f} | {row.evict_s * 1000:.1f}"
        print(f"| {row.label} | {row.prompt} | {row.cached} | {ms} |")
    cold = statistics.median(row.ttft_s for row in rows if row.label == "cold")
    l2 = statistics.median(row.ttft_s for row in rows if row.label.startswith("L2"))
    l3 = statistics.median(
        row.ttft_s for row in rows if row.label.startswith("L3 hit (disk, page cache dropped")
    )
    print()
    print(f"page hits: kv_l2 {l2_hits}, kv_l3 {l3_hits}; files dropped from the page cache: {dropped}")
    print()
    print("| median | TTFT ms | / cold | floor | verdict |")
    print("|---|---|---|---|---|")
    print(f"| cold | {cold * 1000:.1f} | 1.000 | | |")
    for name, value, floor in (("L2 hit", l2, L2_FLOOR), ("L3 hit, page cache dropped", l3, L3_FLOOR)):
        ratio = value / cold
        verdict = "PASS" if ratio <= floor else "FAIL"
        print(f"| {name} | {value * 1000:.1f} | {ratio:.3f} | <= {floor:.3f} | {verdict} |")


if __name__ == "__main__":
    main()
