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
from adapters.local.window import WindowState
from adapters.local.window_cache import WindowCache

Alloc = Callable[[int], list[int] | None]
"""The scheduler's allocator: fresh pages (evicting cached ones first), or None."""


class WindowPaging:
    """Windowed sequences' page work for one scheduler. Engine thread only."""

    def __init__(self, pool: KVPool, cache: PrefixCache, alloc: Alloc) -> None:
        self.pool = pool
        self.cache = cache
        self.alloc = alloc
        self.kept = WindowCache(pool)
        self.slid_pages = 0
        """Pages that slid out of windows and went back to the pool, since start."""
        self.hits = 0
        """Windowed prompts whose kept cache started from cached pages, since start."""
        self.misses = 0
        """Windowed prompts that computed their kept cache from the first token, since start."""
        self._rotations: list[tuple[Sequence, list[int], int]] = []

    def begin_step(self) -> None:
        self._rotations = []

    def rotations(self) -> list[tuple[list[int], int]]:
        """This step's (pages, shift) for the runner."""
        return [(pages, shift) for _, pages, shift in self._rotations]

    def forget(self, seq: Sequence) -> None:
        """`seq` was preempted: its pages are gone, so are its rotations."""
        self._rotations = [r for r in self._rotations if r[0] is not seq]

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
        self.kept.keep(seq.salt, seq.tokens[: seq.num_computed], seq.pages[:held], window.copy())
        seq.pages = []

    def chunk(self, seq: Sequence, chunk: int) -> int:
        """Prompt tokens `seq` computes this step, at most `chunk`: it slides so that its window and
        the chunk fit (carrying `carry` tokens over) and gets the chunk's pages; 0 when the pool
        cannot give them now."""
        window = seq.window
        assert window is not None
        if not self.slide(seq, chunk, keep=window.spec.carry):
            return 0
        chunk = min(chunk, window.room(seq.num_computed))
        need = window.held_pages(seq.num_computed + chunk) - len(seq.pages)
        if need > 0:
            fresh = self.alloc(need)
            if fresh is None:
                return 0
            seq.pages.extend(fresh)
        return chunk

    def slide(self, seq: Sequence, incoming: int, keep: int) -> bool:
        """Slide `seq`'s window so `incoming` more tokens fit: release the pages that fall out,
        copy the shared ones whose keys move, queue the rotations. False, with nothing changed,
        when the pool has no pages for the copies."""
        window = seq.window
        assert window is not None
        count = window.pages_to_slide(seq.num_computed, incoming, keep)
        if count == 0:
            return True
        plan = window.plan_slide(count, seq.num_computed)
        moves = self._own(seq, plan.rotations)
        if moves is None:
            return False
        if seq.lock is not None:  # the cached prefix is no longer this sequence's context
            self.cache.unlock(seq.lock)
            seq.lock = None
        released = window.commit(seq.pages, plan)
        self.pool.release(released)
        self.slid_pages += len(released)
        self._rotations += [(seq, pages, shift) for shift, pages in moves.items()]
        return True

    def footprint(self, running: list[Sequence]) -> tuple[int, int]:
        """(pages running windowed sequences hold, the most they may hold)."""
        held = capacity = 0
        for seq in running:
            if seq.window is not None:
                held += len(seq.pages)
                capacity += seq.window.spec.max_pages(self.pool.page_size)
        return held, capacity

    def _unpin(self, seq: Sequence, state: WindowState) -> None:
        """Release the pinned pages of a resumed kept cache; the window's keys move back over them."""
        if state.pinned == 0:
            return
        first = state.head_pages
        shift = state.pinned * self.pool.page_size
        rotations = [(i, shift) for i in range(first + state.pinned, state.held_pages(seq.num_computed))]
        moves = self._own(seq, rotations)
        if moves is None:  # no pages for the copies: keep the old turn pinned
            return
        released = seq.pages[first : first + state.pinned]
        del seq.pages[first : first + state.pinned]
        self.pool.release(released)
        state.pinned = 0
        self._rotations += [(seq, pages, s) for s, pages in moves.items()]

    def _own(self, seq: Sequence, rotations: list[tuple[int, int]]) -> dict[int, list[int]] | None:
        """Copy the shared pages among `rotations` (page-table index, shift) so `seq` alone holds
        them; the pages to rotate by shift, or None (nothing changed) when the pool has too few."""
        shared = [i for i, _ in rotations if self.pool.refcount(seq.pages[i]) > 1]
        copies = self.alloc(len(shared)) if shared else []
        if copies is None:
            return None
        for i, copy in zip(shared, copies, strict=True):
            self.pool.copy_page(seq.pages[i], copy)
            self.pool.release([seq.pages[i]])
            seq.pages[i] = copy
        moves: dict[int, list[int]] = {}
        for i, shift in rotations:
            moves.setdefault(shift, []).append(seq.pages[i])
        return moves
