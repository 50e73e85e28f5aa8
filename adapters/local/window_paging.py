"""The scheduler's part for windowed sequences (`adapters.local.window`): slides, the copies
and rotations they need, and reuse of kept caches (`adapters.local.window_cache`).

Page ids only, like the scheduler: the rotations a slide needs are collected per step and the
runner applies them (`LlamaModel.shift_keys`) before the step's forward pass reads the keys.
A page another holder shares (the radix cache, a sibling choice) is copied before its keys
move, so no holder ever sees another's positions.
"""

from __future__ import annotations

from collections.abc import Callable

from adapters.local.kv_pool import KVPool
from adapters.local.prefix_cache import PrefixCache
from adapters.local.sequence import Sequence
from adapters.local.window import KeyMove, Rotation, WindowState
from adapters.local.window_cache import WindowCache
from adapters.local.window_store import WindowStore

Alloc = Callable[[int], list[int] | None]
"""The scheduler's allocator: fresh pages (evicting cached ones first), or None."""


class WindowPaging:
    """Windowed sequences' page work for one scheduler. Engine thread only."""

    def __init__(self, pool: KVPool, cache: PrefixCache, alloc: Alloc) -> None:
        self.pool = pool
        self.cache = cache
        self.alloc = alloc
        self.store = WindowStore(cache.offload) if cache.offload is not None else None
        """Kept windows that leave memory go to the offload's L2/L3 tiers, and come back from them."""
        self.kept = WindowCache(pool, on_drop=self.store.save if self.store is not None else None)
        self.slid_pages = 0
        """Pages that slid out of windows and went back to the pool, since start."""
        self.hits = 0
        """Windowed prompts whose kept cache started from cached pages, since start."""
        self.misses = 0
        """Windowed prompts that computed their kept cache from the first token, since start."""
        self._moves: list[tuple[Sequence, KeyMove]] = []

    def begin_step(self) -> None:
        self._moves = []
        self.kept.settle()

    def rotations(self) -> list[KeyMove]:
        """This step's key moves for the runner, in order."""
        return [move for _, move in self._moves]

    def admitted(self, seq: Sequence, cached: int) -> None:
        """Count a windowed prompt's admission: reused when it started from `cached` > 0 tokens."""
        self.hits += cached > 0
        self.misses += cached == 0

    def resume(self, seq: Sequence, at_least: int) -> bool:
        """Take over the kept cache of an earlier windowed sequence whose whole history `seq`'s
        prompt starts with (covering more than `at_least` tokens); False when there is none.
        Pages the earlier request pinned are released when this one pins a turn of its own."""
        window = seq.window
        assert window is not None
        if seq.forks:  # siblings fork from a prompt computed here; keep it simple: they recompute
            return False
        kept = self.kept.take(seq.salt, seq.tokens[:-1], at_least)
        if kept is None and self.store is not None and len(seq.tokens) > window.sinks + window.spec.size:
            kept = self.store.load(seq.salt, seq.tokens[:-1], at_least, window.spec, self.alloc)
        if kept is None:
            return False
        state = kept.window
        seq.pages, seq.num_computed = kept.pages, kept.tokens
        if window.pin is not None and window.pin[0] >= state.head_pages + state.moved:
            self._unpin(seq, state)
            state.pin = window.pin
        seq.window = state
        return True

    def keep(self, seq: Sequence) -> None:
        """`seq` finishes or is preempted: a window that slid leaves its kept cache for reuse (its
        page references move there); one that did not is the radix cache's to keep."""
        window = seq.window
        if window is None or not window.slid or seq.num_computed == 0:
            return
        held = window.held_pages(seq.num_computed)
        self.pool.release(seq.pages[held:])  # pages allocated ahead, unused
        settled = all(queued is not seq for queued, _ in self._moves)  # else its moves run this step
        self.kept.keep(
            seq.salt, seq.tokens[: seq.num_computed], seq.pages[:held], window.copy(), settled=settled
        )
        seq.pages, window.anchors = [], []

    def persist(self) -> int:
        """Write the kept windows still in memory to L3 (shutdown: the engine thread has stopped);
        how many were written."""
        if self.store is None or self.store.offload.disk is None:
            return 0
        return sum(self.store.save(entry, disk_only=True) for entry in self.kept.entries())

    def chunk(self, seq: Sequence, chunk: int) -> int:
        """Prompt tokens `seq` computes this step, at most `chunk`: it slides so that the chunk's
        last token sees the head and `size` window tokens, the first at least `carry` before it,
        and gets the chunk's pages; 0 when the pool cannot give them now."""
        window = seq.window
        assert window is not None
        chunk = min(chunk, window.room(seq.num_computed, keep=window.spec.carry))
        if not self.slide(seq, seq.num_computed + chunk - 1):
            return 0
        need = window.held_pages(seq.num_computed + chunk) - len(seq.pages)
        if need > 0:
            fresh = self.alloc(need)
            if fresh is None:
                return 0
            seq.pages.extend(fresh)
        return chunk

    def slide(self, seq: Sequence, last: int) -> bool:
        """Slide `seq`'s window so token `last` attends to the head and the `size` tokens up to it:
        release the pages that fall out, copy the shared ones whose keys move, queue the key
        moves. False, with nothing changed, when the pool has no pages for the copies."""
        window = seq.window
        assert window is not None
        plan = window.plan_slide(last, seq.num_computed)
        if plan is None:
            return True
        first_hide = not window.anchors  # the head's keys as they are become its anchors
        refreshed = {index for index, _ in window.refresh()}
        writes = {r.index for r in plan.rotations} | {i for i, _ in plan.frozen}
        if not first_hide:
            writes |= refreshed
        extra = (window.head_pages if first_hide else 0) + len(plan.frozen)
        fresh = self._own(seq, sorted(writes - (refreshed if first_hide else set())), extra)
        if fresh is None:
            return False
        ps, pages = self.pool.page_size, seq.pages
        if first_hide:
            for index in range(window.head_pages):
                live = fresh.pop()
                self.pool.copy_page(pages[index], live)
                window.anchors.append(pages[index])  # its reference moves from the table
                pages[index] = live
        for index, shift in plan.frozen:
            anchor = fresh.pop()
            window.anchors.append(anchor)
            self._queue(seq, KeyMove(_slots(anchor, 0, ps, ps), shift, _slots(pages[index], 0, ps, ps)))
        moves = _group(pages, plan.rotations, ps)
        if seq.lock is not None:  # the cached prefix is no longer this sequence's context
            self.cache.unlock(seq.lock)
            seq.lock = None
        old_offset = window.head_offset
        released = window.commit(pages, plan)
        self.pool.release(released)
        self.slid_pages += len(released)
        for move in moves:
            self._queue(seq, move)
        if first_hide or plan.frozen or window.head_offset != old_offset:
            slots: list[int] = []
            sources: list[int] = []
            for index, count in window.refresh():
                slots += _slots(pages[index], 0, count, ps)
                sources += _slots(window.anchors[index], 0, count, ps)
            self._queue(seq, KeyMove(slots, -window.head_offset, sources))
        return True

    def footprint(self, running: list[Sequence]) -> tuple[int, int]:
        """(pages running windowed sequences hold, the most they may hold)."""
        held = capacity = 0
        for seq in running:
            if seq.window is not None:
                held += len(seq.pages) + len(seq.window.anchors)
                capacity += seq.window.spec.max_pages(self.pool.page_size)
        return held, capacity

    def _unpin(self, seq: Sequence, state: WindowState) -> None:
        """Release the pinned pages of a resumed kept cache; the window's keys move back over them."""
        if state.pinned == 0:
            return
        table = seq.pages
        seq.pages = table[: state.head_pages] + table[state.head_pages + state.pinned :]
        rotations = state.unpin_rotations(seq.num_computed)
        if self._own(seq, sorted({r.index for r in rotations}), 0) is None:
            seq.pages = table  # no pages for the copies: keep the old turn pinned
            return
        self.pool.release(state.unpin(table))
        for move in _group(seq.pages, rotations, self.pool.page_size):
            self._queue(seq, move)

    def _queue(self, seq: Sequence, move: KeyMove) -> None:
        self._moves.append((seq, move))

    def _own(self, seq: Sequence, indices: list[int], extra: int) -> list[int] | None:
        """Copy the shared pages among table entries `indices` so `seq` alone holds them, and
        allocate `extra` pages more (returned); None, with nothing changed, when the pool has too few."""
        shared = [i for i in indices if self.pool.refcount(seq.pages[i]) > 1]
        fresh = self.alloc(len(shared) + extra) if shared or extra else []
        if fresh is None:
            return None
        for i in shared:
            copy = fresh.pop()
            self.pool.copy_page(seq.pages[i], copy)
            self.pool.release([seq.pages[i]])
            seq.pages[i] = copy
        return fresh


def _slots(page: int, first: int, end: int, page_size: int) -> list[int]:
    return list(range(page * page_size + first, page * page_size + end))


def _group(pages: list[int], rotations: list[Rotation], page_size: int) -> list[KeyMove]:
    """In-place rotations as one key move per shift (page ids read from the table as it is)."""
    by_shift: dict[int, list[int]] = {}
    for r in rotations:
        by_shift.setdefault(r.shift, []).extend(_slots(pages[r.index], r.first, r.end, page_size))
    return [KeyMove(slots, shift) for shift, slots in by_shift.items()]
