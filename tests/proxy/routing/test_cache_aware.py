"""The cache_aware policy through the pool: prefix affinity, load balance, guards, tenant isolation."""

from __future__ import annotations

import asyncio
import math
import time
from array import array

import msgspec
import pytest

from adapters.schema import PromptTokensDetails, Usage
from proxy.routing.config import DEFAULT_LOAD_EPSILON, DEFAULT_PREFILL_TOKENS_PER_S, RoutingSettings
from tests.proxy.routing.conftest import chat_request, make_pool

SYSTEM = "You are a careful assistant. " * 40


async def test_requests_sharing_a_prefix_land_on_the_same_worker() -> None:
    pool = make_pool(4)
    first = await pool.acquire(chat_request(SYSTEM, "question one"))
    first.release(usage=None, failed=False)
    for i in range(5):
        lease = await pool.acquire(chat_request(SYSTEM, f"question {i}"))
        assert lease.worker_id == first.worker_id
        lease.release(usage=None, failed=False)


async def test_unrelated_prompts_spread_over_idle_workers() -> None:
    pool = make_pool(3)
    leases = [await pool.acquire(chat_request(f"system prompt number {i} " * 30, "hi")) for i in range(3)]
    assert len({lease.worker_id for lease in leases}) == 3


async def test_multi_turn_chats_sharing_one_system_prompt_do_not_pile_onto_one_worker() -> None:
    pool = make_pool(4)
    # 16 concurrent conversations, all in flight at once, all starting with the same long system prompt.
    leases = [await pool.acquire(chat_request(SYSTEM, f"conversation {i} " * 20)) for i in range(16)]
    per_worker: dict[str, int] = {}
    for lease in leases:
        per_worker[lease.worker_id] = per_worker.get(lease.worker_id, 0) + 1
    assert len(per_worker) == 4
    # An idle worker takes the next request while another is above the mean, whatever its prefix;
    # once every worker holds the prompt, the least queued work evens them out.
    assert max(per_worker.values()) <= 5


async def test_a_conversation_returns_to_the_worker_holding_its_history() -> None:
    pool = make_pool(4)
    busy = [await pool.acquire(chat_request(SYSTEM, f"other {i} " * 20)) for i in range(4)]
    history = "turn one of a long conversation " * 60
    lease = await pool.acquire(chat_request(SYSTEM, history))
    home = lease.worker_id
    lease.release(usage=None, failed=False)
    follow_up = await pool.acquire(chat_request(SYSTEM, history + " and a follow-up question"))
    assert follow_up.worker_id == home
    for other in busy:
        other.release(usage=None, failed=False)


async def test_no_worker_goes_above_the_load_bound_while_others_have_room() -> None:
    pool = make_pool(4, cache_aware={"load_epsilon": 0.25})
    # 40 requests for one prefix, all in flight: one worker could hold its cache, not its load.
    held = [await pool.acquire(chat_request(SYSTEM, f"q{i}")) for i in range(40)]
    per_worker = [w.in_flight for w in pool.workers()]
    assert sum(per_worker) == 40
    assert max(per_worker) <= 13  # ceil(1.25 x 40 / 4)
    for lease in held:
        lease.release(usage=None, failed=False)


async def test_a_hot_prefix_spreads_to_more_workers_while_the_others_keep_their_affinity() -> None:
    pool = make_pool(4, cache_aware={"load_epsilon": 0.25})
    homes = {}
    for i in range(8):  # eight prefixes, each cached on one worker
        system = f"cold system prompt {i} " * 40
        lease = await pool.acquire(chat_request(system, "first"))
        homes[system] = lease.worker_id
        lease.release(usage=None, failed=False)
    hot = "the hot system prompt everyone uses " * 40
    held, hot_workers = [], []
    for i in range(24):  # the hot prefix's demand, all in flight: more than one worker's share
        lease = await pool.acquire(chat_request(hot, f"hot {i}"))
        hot_workers.append(lease.worker_id)
        held.append(lease)
    assert max(w.in_flight for w in pool.workers()) <= 8  # ceil(1.25 x 24 / 4)
    # It spread to every worker, each of which now holds it...
    hot_tokens, _ = await pool.prompts.tokens(chat_request(hot, "later"), pool.workers())
    assert all(w.match(hot_tokens) > 0.9 * len(hot_tokens) for w in pool.workers())
    # ...and the first worker kept the most of it: the others took only the overflow.
    first = hot_workers[0]
    assert hot_workers.count(first) == max(hot_workers.count(w) for w in set(hot_workers))
    # Meanwhile every cold prefix still goes to the worker that holds it (each has room).
    for system, home in homes.items():
        lease = await pool.acquire(chat_request(system, "again"))
        assert lease.worker_id == home, "a cold prefix lost its affinity"
        lease.release(usage=None, failed=False)
    for lease in held:
        lease.release(usage=None, failed=False)


async def test_tenants_never_share_a_routing_prefix() -> None:
    pool = make_pool(2)
    lease = await pool.acquire(chat_request(SYSTEM, "q", salt="tenant-a"))
    worker = next(w for w in pool.workers() if w.id == lease.worker_id)
    same_prompt_other_tenant = await pool.acquire(chat_request(SYSTEM, "q", salt="tenant-b"))
    # Tenant b's prompt does not match tenant a's path, so it goes to the idle worker.
    assert same_prompt_other_tenant.worker_id != lease.worker_id
    assert worker.tree.total_tokens > 0


async def test_engine_reported_cache_misses_shrink_the_tree() -> None:
    pool = make_pool(2)
    lease = await pool.acquire(chat_request(SYSTEM, "q"))
    worker = next(w for w in pool.workers() if w.id == lease.worker_id)
    lease.release(usage=None, failed=False)
    before = worker.capacity_estimate
    lease = await pool.acquire(chat_request(SYSTEM, "q2"))
    assert lease.worker_id == worker.id  # the prefix sticks
    # The tree predicted the system prompt cached; the engine says nothing was.
    lease.release(
        usage=Usage(prompt_tokens=300, prompt_tokens_details=PromptTokensDetails(cached_tokens=0)),
        failed=False,
    )
    assert worker.mispredictions == 1
    assert worker.capacity_estimate < before


async def test_unknown_cached_tokens_change_nothing() -> None:
    pool = make_pool(2)
    lease = await pool.acquire(chat_request(SYSTEM, "q"))
    worker = next(w for w in pool.workers() if w.id == lease.worker_id)
    lease.release(usage=None, failed=False)
    lease = await pool.acquire(chat_request(SYSTEM, "q2"))
    assert lease.worker_id == worker.id and lease._predicted > 0  # a hit is predicted...
    lease.release(usage=Usage(prompt_tokens=300), failed=False)  # ...and the engine says nothing
    assert worker.predicted_tokens == 0 and worker.mispredictions == 0


async def test_trees_stay_within_worker_capacity() -> None:
    pool = make_pool(2)
    for worker in pool.workers():
        worker.set_capacity(2000, "config")
    for i in range(20):
        lease = await pool.acquire(chat_request(f"distinct system prompt {i} " * 20, "q"))
        lease.release(usage=None, failed=False)
        await asyncio.sleep(0)  # the pool trims a tree right after the decision that outgrew it
        assert all(worker.tree.total_tokens <= worker.tree_limit for worker in pool.workers())
    # A byte tree (no tokenizer) holds 2,000 tokens' worth of bytes, not 2,000 bytes.
    assert all(worker.tree.total_tokens > 4000 for worker in pool.workers())


def test_cache_aware_settings_reject_unknown_keys() -> None:
    with pytest.raises(msgspec.ValidationError, match="match_treshold"):
        msgspec.convert({"cache_aware": {"match_treshold": 0.5}}, RoutingSettings)


async def test_a_model_with_one_worker_is_routed_without_tokenizing() -> None:
    alone = make_pool(1)
    (await alone.acquire(chat_request(SYSTEM, "q"))).release(usage=None, failed=False)
    assert alone.workers()[0].tree.total_tokens == 0  # nothing to choose, so no tree upkeep
    pair = make_pool(2)
    lease = await pair.acquire(chat_request(SYSTEM, "q"))
    lease.release(usage=None, failed=False)
    assert next(w for w in pair.workers() if w.id == lease.worker_id).tree.total_tokens > 0


async def _history_home_and_other(slack: float) -> tuple[str, str]:
    """A conversation whose ~5,200-byte prompt (~1,300 tokens at the assumed 4 bytes per token) lives
    on one of two workers, and the worker chosen for its next turn right after 2,000 tokens of other
    requests' prefill were queued on that home worker, while the other worker's cache is full: the
    cost still favours the history (recomputing it there costs 1,300 tokens of prefill and evicts as
    much, against 2,000 queued), the first token does not (0.1 s of prefill to wait for there,
    0.065 s to recompute on the idle one)."""
    pool = make_pool(2, cache_aware={"ttft_slack_s": slack})
    history = "an earlier turn of this conversation " * 108
    lease = await pool.acquire(chat_request(SYSTEM, history))
    home = next(w for w in pool.workers() if w.id == lease.worker_id)
    lease.release(usage=None, failed=False)
    other = next(w for w in pool.workers() if w is not home)
    other.set_capacity(1_500, "config")
    other.tree.insert(array("I", [7] * 6_000))  # 1,500 tokens at 4 bytes each: full
    now = time.monotonic()
    home.prefill_free_at = now  # the first turn's own prefill is long done
    home.charge(prefill=2_000, decode=0, prefill_hold_s=60, now=now)
    home.queue_prefill(2_000, DEFAULT_PREFILL_TOKENS_PER_S, now)
    follow_up = await pool.acquire(chat_request(SYSTEM, history + " and the next question"))
    return home.id, follow_up.worker_id


async def test_ttft_guard_moves_a_turn_off_a_worker_with_a_long_prefill_queue() -> None:
    home, chosen = await _history_home_and_other(slack=0.02)
    assert chosen != home


async def test_without_the_ttft_guard_the_cost_keeps_the_turn_with_its_history() -> None:
    home, chosen = await _history_home_and_other(slack=float("inf"))
    assert chosen == home


def test_a_workers_prefill_queue_drains_at_its_prefill_speed() -> None:
    pool = make_pool(2)
    worker = pool.workers()[0]
    worker.queue_prefill(20_000, 20_000.0, now=100.0)
    worker.queue_prefill(10_000, 20_000.0, now=100.5)  # queues behind the first
    assert worker.prefill_wait(100.5) == 1.0
    assert worker.prefill_wait(101.25) == 0.25
    assert worker.prefill_wait(200.0) == 0.0
    worker.queue_prefill(2_000, 20_000.0, now=200.0)  # an idle queue starts now, not in the past
    assert worker.prefill_wait(200.0) == pytest.approx(0.1)


async def test_affinity_never_leaves_a_worker_idle_while_another_is_over_the_bound() -> None:
    pool = make_pool(2, cache_aware={"load_epsilon": 0.25})
    # Ten requests sharing a system prompt arrive one at a time and stay in flight. By cost alone
    # each would land where the prompt is cached (a miss elsewhere weighs more than one more short
    # decode in the busy worker's batch); the load bound fills the idle worker.
    held = [await pool.acquire(chat_request(SYSTEM, f"q{i}", max_tokens=16)) for i in range(10)]
    assert max(w.in_flight for w in pool.workers()) <= 7  # ceil(1.25 x 10 / 2)
    assert {lease.worker_id for lease in held} == {"w0", "w1"}


async def test_the_default_bound_holds_a_prefix_to_twice_the_mean_and_leaves_no_worker_idle() -> None:
    pool = make_pool(4)
    assert pool.settings.cache_aware.load_epsilon == DEFAULT_LOAD_EPSILON
    # 40 requests for one prefix, all in flight: every worker is warmed (none stays idle while
    # another is above the mean) and none holds more than ceil(2 x 40 / 4).
    held = [await pool.acquire(chat_request(SYSTEM, f"q{i}")) for i in range(40)]
    per_worker = [w.in_flight for w in pool.workers()]
    assert min(per_worker) > 0
    assert max(per_worker) <= math.ceil((1 + DEFAULT_LOAD_EPSILON) * 40 / 4)
    for lease in held:
        lease.release(usage=None, failed=False)


async def test_a_new_prefix_goes_where_it_evicts_least() -> None:
    pool = make_pool(2)
    full, roomy = pool.workers()
    for worker in (full, roomy):
        worker.set_capacity(2_000, "config")
    full.tree.insert(array("I", [7] * 8_000))  # 2,000 tokens at the assumed 4 bytes each: full
    # The roomy worker is busier (200 tokens of queued work), but a miss of ~300 tokens on the full
    # one would also evict as much of a cached prefix, which is recomputed when it is asked again.
    roomy.charge(prefill=0, decode=200, prefill_hold_s=0, now=time.monotonic())
    lease = await pool.acquire(chat_request("a prompt nobody has sent before " * 40, "q"))
    assert lease.worker_id == roomy.id


async def test_a_miss_waits_behind_the_prefill_still_computing_on_a_worker() -> None:
    pool = make_pool(2)
    busy, free = pool.workers()
    now = time.monotonic()
    # By decode alone `busy` is the less loaded...
    busy.charge(prefill=0, decode=32, prefill_hold_s=0, now=now)
    free.charge(prefill=0, decode=64, prefill_hold_s=0, now=now)
    # ...but a batch of misses was just sent there: one second of prefill at the configured speed.
    busy.queue_prefill(DEFAULT_PREFILL_TOKENS_PER_S, DEFAULT_PREFILL_TOKENS_PER_S, now)
    lease = await pool.acquire(chat_request("a prompt nobody has sent before " * 40, "q"))
    assert lease.worker_id == free.id


async def test_weighing_a_worker_is_not_a_use_of_its_prefixes() -> None:
    """A stale copy of a prefix on a worker the requests no longer go to ages in that worker's tree
    as it does in its engine's cache: weighing the worker for each request must not refresh it, or
    the tree forgets the prefixes that worker really serves first."""
    pool = make_pool(2)
    home, other = pool.workers()
    hot = chat_request("the hot system prompt " * 40, "q")
    tokens, _ = await pool.prompts.tokens(hot, pool.workers())
    served, _ = await pool.prompts.tokens(chat_request("the other worker's own prompt " * 40, "q"), [other])
    other.remember(tokens[: len(tokens) // 2])  # a stale half-copy, sent there long ago
    other.remember(served)  # what `other` serves now
    home.remember(tokens)
    for _ in range(3):
        lease = await pool.acquire(hot)
        assert lease.worker_id == home.id  # the longer match
        lease.release(usage=None, failed=False)
    other.tree.evict(1)  # one leaf: the least recently used
    assert other.match(served) == len(served) - len(served) % other.tree.page_size
    assert other.match(tokens) < len(tokens) // 4


async def test_a_prefix_every_worker_holds_waits_behind_no_ones_prefill_queue() -> None:
    """A system prompt cached on every worker is the same reuse anywhere: the request goes where the
    prefill already queued is shortest, not to the worker with the least decode (a group of chats
    ending together on one worker would otherwise all restart there, and stay in lockstep)."""
    pool = make_pool(2)
    busy, free = pool.workers()
    warm, _ = await pool.prompts.tokens(chat_request(SYSTEM, "warm"), pool.workers())
    for worker in (busy, free):
        worker.remember(warm)  # both hold the system prompt
    now = time.monotonic()
    free.charge(prefill=0, decode=64, prefill_hold_s=0, now=now)  # by decode alone `busy` is lighter
    busy.queue_prefill(DEFAULT_PREFILL_TOKENS_PER_S, DEFAULT_PREFILL_TOKENS_PER_S, now)  # 1 s queued
    lease = await pool.acquire(chat_request(SYSTEM, "a new conversation"))
    assert lease.worker_id == free.id
    # A prompt only `busy` holds waits for it there: moving would cost its whole prefill again.
    history = "a conversation's long history " * 40
    busy.remember((await pool.prompts.tokens(chat_request(SYSTEM, history), [busy]))[0])
    follow_up = await pool.acquire(chat_request(SYSTEM, history + " and a follow-up"))
    assert follow_up.worker_id == busy.id
