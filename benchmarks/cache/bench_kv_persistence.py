"""The embedded engine's prefix cache across restarts: the three floors of issue #25.

Run: ``.venv/bin/python -m benchmarks.cache.bench_kv_persistence [restart|decode|flush ...]``
(all three by default; prints Markdown tables). SmolLM2-135M-Instruct, fp32 KV, page 16.

- ``restart``: TTFT of a 2,048-token prefix + a 16-token question, cold vs. after a graceful restart.
  An engine with an L3 directory computes each prompt once (cold; the pool holds all of them, so
  nothing is evicted: only write-behind and the shutdown flush can save them), is closed (the
  flush), and a new engine on the same directory asks each again, the page files first dropped from
  the OS page cache (``posix_fadvise(DONTNEED)``) so they are read from the device. Floor: median
  restarted TTFT <= 1/4 of the median cold one; the first token must not change.
- ``decode``: decode throughput of 16 concurrent streams (256-token distinct prompts, 64 greedy tokens
  each), write-behind off (``kv_write_behind_after_s = None``) against the default (2 s) and the
  eager setting (``0``: every page the cache adopts is due at once, so the prompts' pages are
  written while the streams decode), rounds alternating between the three engines (one process,
  shared weights), fresh prompts each round, each round started once no engine has pages left to
  write. Throughput counts the tokens after the last stream's first token, over that window.
  Floor: every setting >= 0.95 x off (medians).
- ``flush``: a prefix cache holding 64k tokens (4,096 pages of random KV, none on disk yet) flushed
  the way shutdown does (``finish_by``, ``WriteBehind.flush``: each page written at once from the
  pool's memory, then the disk tier's close; unsynced, and the ``os.sync()`` after it is timed
  apart), then the directory reopened and every page counted. Floor: <= 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import torch

from adapters.local import LocalEngineConfig
from adapters.local.config import DEFAULT_KV_WRITE_BEHIND_AFTER_S
from adapters.local.engine import LocalEngine
from adapters.local.kv_pool import KVPool
from adapters.local.loader import LoadedModel, load_model
from adapters.local.offload import KVOffload
from adapters.local.prefix_cache import PrefixCache
from benchmarks.cache.bench_kv_offload import drop_page_cache, first_token
from benchmarks.engine.workloads import ours, token_ids
from cachelayer.disk import DiskTier, DiskTierConfig

PREFIX_TOKENS = 2048
QUESTION_TOKENS = 16
RESTART_FLOOR = 1 / 4
STREAMS, STREAM_PROMPT, STREAM_TOKENS = 16, 256, 64
DECODE_FLOOR = 0.95
FLUSH_TOKENS, FLUSH_FLOOR_S = 64 * 1024, 5.0
NEVER = 1e9


def restart(model: LoadedModel, base: LocalEngineConfig, prompts: int) -> None:
    question = token_ids(QUESTION_TOKENS, seed=999)
    batch = [token_ids(PREFIX_TOKENS, seed=100 + seed) + question for seed in range(prompts)]
    with tempfile.TemporaryDirectory(prefix="radixgate-kv-restart-") as folder:
        config = replace(base, kv_offload=True, kv_offload_dir=Path(folder))
        first = LocalEngine(config, model=model)
        first.start_sync()
        cold = [asyncio.run(first_token(first, prompt)) for prompt in batch]
        started = time.perf_counter()
        first.close_sync()  # the graceful shutdown: flush within kv_shutdown_flush_s
        close_s = time.perf_counter() - started
        drop_page_cache(Path(folder))
        second = LocalEngine(config, model=model)
        started = time.perf_counter()
        second.start_sync()
        open_s = time.perf_counter() - started
        warm = [asyncio.run(first_token(second, prompt)) for prompt in batch]
        second.close_sync()
    assert all(c[1] == w[1] for c, w in zip(cold, warm, strict=True)), "a reloaded prefix changed the answer"
    print("| prompt | cold TTFT ms | after restart TTFT ms | cached tokens after restart |")
    print("|---|---|---|---|")
    for index, (c, w) in enumerate(zip(cold, warm, strict=True)):
        print(f"| {index} | {c[0] * 1000:.1f} | {w[0] * 1000:.1f} | {w[2]} |")
    ratio = statistics.median(w[0] for w in warm) / statistics.median(c[0] for c in cold)
    verdict = "PASS" if ratio <= RESTART_FLOOR else "FAIL"
    print(f"\nrestart TTFT / cold (median): {ratio:.3f} (floor <= {RESTART_FLOOR:.3f}) {verdict}")
    print(f"shutdown (stop + flush + close) {close_s:.2f} s; start on the same directory {open_s:.2f} s\n")


def decode(model: LoadedModel, base: LocalEngineConfig, rounds: int) -> None:
    settings = {
        "off": None,
        f"default ({DEFAULT_KV_WRITE_BEHIND_AFTER_S:g} s)": DEFAULT_KV_WRITE_BEHIND_AFTER_S,
        "eager (0 s)": 0.0,
    }
    rates: dict[str, list[float]] = {name: [] for name in settings}
    written: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="radixgate-kv-decode-") as folder:
        engines: dict[str, LocalEngine] = {}
        for index, (name, after_s) in enumerate(settings.items()):
            config = replace(base, kv_offload=True, kv_offload_dir=Path(folder) / str(index))
            engines[name] = LocalEngine(replace(config, kv_write_behind_after_s=after_s), model=model)
            engines[name].start_sync()
        for round_ in range(rounds):
            for offset, (name, engine) in enumerate(engines.items()):
                quiet(engines.values())  # no engine's idle write-behind runs during another's round
                prompts = [
                    token_ids(STREAM_PROMPT, seed=100_000 * round_ + 1000 * offset + i)
                    for i in range(STREAMS)
                ]
                _, timings = ours(engine, prompts, STREAM_TOKENS)
                start = max(t.first_token_s for t in timings)
                end = max(t.seconds for t in timings)
                tokens = sum(1 for t in timings for at in t.token_times if at > start)
                rates[name].append(tokens / (end - start))
        for name, engine in engines.items():
            stats = engine.kv_offload_stats()
            written[name] = stats.written_behind_pages if stats is not None else 0
            engine.close_sync()
    print("| write-behind | decode tok/s per round | median | / off | pages written behind |")
    print("|---|---|---|---|---|")
    off = statistics.median(rates["off"])
    for name, values in rates.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        median = statistics.median(values)
        print(f"| {name} | {each} | {median:.1f} | {median / off:.3f} | {written[name]} |")
    worst = min(statistics.median(values) for values in rates.values()) / off
    verdict = "PASS" if worst >= DECODE_FLOOR else "FAIL"
    print(f"\ndecode, worst setting / off (median): {worst:.3f} (floor >= {DECODE_FLOOR}) {verdict}\n")


def quiet(engines: Iterable[LocalEngine]) -> None:
    """Wait until no engine has pages left to write behind, and give the L3 writers a moment."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pending = [engine.kv_offload_stats() for engine in engines]
        if all(stats is None or stats.write_behind_pending_pages == 0 for stats in pending):
            break
        time.sleep(0.05)
    time.sleep(0.5)


def flush(model: LoadedModel, base: LocalEngineConfig) -> None:
    pages = FLUSH_TOKENS // base.page_size
    pool = KVPool(model.spec, pages, base.page_size, torch.float32)
    with tempfile.TemporaryDirectory(prefix="radixgate-kv-flush-") as folder:
        offload = KVOffload(
            pool,
            model_id=f"{base.model_id}/{base.dtype}",
            tokenizer_hash=model.sha256,
            memory_bytes=0,
            directory=Path(folder),
            disk_bytes=base.kv_offload_disk_bytes,
            min_speedup=1.0,
            write_behind_after_s=NEVER,
        )
        cache = PrefixCache(pool, enabled=True, max_cached_tokens=None, policy="lru", offload=offload)
        per_prompt = 1024
        for seed in range(FLUSH_TOKENS // per_prompt):
            held = pool.alloc(per_prompt // base.page_size)
            assert held is not None
            for page in held:
                pool.page_keys(page).normal_()
                pool.page_values(page).normal_()
            cache.insert("", token_ids(per_prompt, seed=seed), held)
            pool.release(held)  # the tree keeps its reference
        write_behind = offload.write_behind
        assert write_behind is not None and write_behind.pending_pages == pages
        started, cpu_started = time.perf_counter(), os.times()
        deadline = time.monotonic() + 120
        offload.finish_by(deadline)  # what `LocalEngine`'s shutdown does, after its thread stopped
        result = write_behind.flush(deadline)
        offload.close(deadline)
        seconds, cpu = time.perf_counter() - started, os.times()
        cpu_s = cpu.user + cpu.system - cpu_started.user - cpu_started.system  # all threads
        sync_started = time.perf_counter()
        os.sync()  # for the record: how long the device then takes to hold it all
        sync_s = time.perf_counter() - sync_started
        reopened = DiskTier(DiskTierConfig(directory=Path(folder), capacity_bytes=base.kv_offload_disk_bytes))
        entries, size = reopened.stats().entries, reopened.stats().bytes or 0
        reopened.close()
    assert result.left == 0 and entries == pages, (result, entries)
    verdict = "PASS" if seconds <= FLUSH_FLOOR_S else "FAIL"
    print("| flushed | pages | bytes on disk | flush s | CPU s | MB/s | floor | verdict | then os.sync() s |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {FLUSH_TOKENS} tokens | {entries} | {size} | {seconds:.2f} | {cpu_s:.2f} "
        f"| {size / seconds / 1e6:.0f} | <= {FLUSH_FLOOR_S:.0f} s | {verdict} | {sync_s:.2f} |\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["restart", "decode", "flush"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=3, help="restart: distinct prefixes (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="decode: rounds per setting (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = LocalEngineConfig(threads=args.threads)
    model = load_model(base)
    for part in args.parts:
        print(f"## {part}\n")
        {
            "restart": lambda: restart(model, base, args.prompts),
            "decode": lambda: decode(model, base, args.rounds),
            "flush": lambda: flush(model, base),
        }[part]()


if __name__ == "__main__":
    main()
