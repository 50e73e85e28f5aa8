"""Sliding-window attention with attention sinks (StreamingLLM, Xiao et al. 2023) over the paged pool.

A windowed sequence keeps the K/V of its first `sinks` tokens (the attention sinks) and of its
most recent tokens; every token attends to the sinks and to exactly the `size` tokens up to itself
(a prompt chunk's tokens: up to the chunk's last), so its memory and its attention cost stay
bounded however long the conversation grows. Before anything is hidden it is exactly a dense one.

Layout: `Sequence.pages` is the head's pages (the first `ceil(sinks / page_size)` pages, of which
the first `sinks` slots are the head), the pinned pages (`Carry`), then the window's pages. The
window is masked at token granularity: its oldest page may be partly hidden (a `PageRun` that
skips its first slots; the head's last page is the window's first while its tail is in view), and
it is released to the pool (or to the radix cache, which may still hold it) once wholly behind.

Positions: each query must see each key at the distance it has in the kept cache, where positions
are counted within it (the head, the pinned pages, then the window). RoPE is relative, so the pool
keeps keys rotated and moves only two groups, never the query:
- a window key is stored at its index minus `base`, which changes only when a page leaves: every
  window key is then rotated back by a page in place (`LlamaModel.shift_keys`; a key is re-rotated
  at most `size / page_size` times while it stays in the window);
- a head (or pinned) key is stored at its place in the kept cache plus `head_offset`, which follows
  the query at every step (`offset = first shown - its page's start - page_size`); these few keys
  are rewritten each step from `anchors`, copies of them at their places, never rotated in place,
  so fp32 rounding does not build up over a long conversation.
`base` puts the oldest window page's start a page below the kept tokens' end, so the latest query
stays below `kept + size` (a head key may sit at a small negative position: only distances count).
A page another holder shares (the radix cache, a sibling choice) is copied before its keys move.

Prefill of a long prompt runs blockwise: before each chunk the window slides so that the chunk's
last token sees exactly `size` window tokens while the first keeps at least `carry` tokens before
it (`window_overlap`, bounded by half the window). Memory is bounded by the head's pages and their
anchors, the window and the partly hidden page before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from adapters.local.attention_plan import PageRun, page_runs
from adapters.local.config import DEFAULT_SINK_TOKENS, DEFAULT_WINDOW_OVERLAP, DEFAULT_WINDOW_SIZE

MIN_WINDOW_PAGES = 4
"""A window must hold at least this many pages: one slides out while the others carry the context."""


@dataclass(slots=True, frozen=True)
class WindowSpec:
    """How a windowed sequence attends."""

    sinks: int = DEFAULT_SINK_TOKENS
    size: int = DEFAULT_WINDOW_SIZE
    overlap: int = DEFAULT_WINDOW_OVERLAP

    @property
    def carry(self) -> int:
        """Window tokens a prefill chunk keeps before it: `overlap`, at most half the window."""
        return min(self.overlap, self.size // 2)

    def max_pages(self, page_size: int) -> int:
        """Most pages one windowed sequence holds: its sink pages and their anchors, a full window
        and the partly hidden page before it."""
        return 2 * -(-self.sinks // page_size) + -(-self.size // page_size) + 1

    def check(self, page_size: int, context_length: int) -> None:
        """Raise ValueError when this window cannot run with these pages on this model."""
        if self.sinks < 1:
            raise ValueError("sink_tokens must be >= 1")
        if self.size < MIN_WINDOW_PAGES * page_size:
            least = MIN_WINDOW_PAGES * page_size
            raise ValueError(f"window_size must be at least {MIN_WINDOW_PAGES} pages ({least} tokens)")
        if not 0 <= self.overlap < self.size:
            raise ValueError("window_overlap must be >= 0 and smaller than window_size")
        if self.sinks + 2 * (self.size + page_size) > context_length:
            # A chat's carried system prompt and latest turn take up to half a window (and a page) each.
            raise ValueError(
                f"sink_tokens + twice window_size must fit the model's context ({context_length})"
            )


@dataclass(slots=True, frozen=True)
class Carry:
    """Spans of a chat prompt the window never cuts (`prepare.carry_spans` finds them)."""

    head: int = 0
    """Tokens from the first on kept with the sinks: the system prompt."""
    pin_start: int = 0
    pin_end: int = 0
    """The latest user turn `[pin_start, pin_end)`, kept in whole pages once the window passes it."""


class KeyMove(NamedTuple):
    """Keys for the runner to move before a step (`LlamaModel.shift_keys`): those of token `slots`
    rotated `shift` positions back, read from `sources` (same length) when given."""

    slots: list[int]
    shift: int
    sources: list[int] | None = None


@dataclass(slots=True, frozen=True)
class Rotation:
    """Keys of slots `[first, end)` of page-table entry `index` to move `shift` positions back."""

    index: int
    first: int
    end: int
    shift: int


@dataclass(slots=True)
class SlidePlan:
    """What moving the window's start to `begin` does, before it is done (indices into the page
    table as it is): entries released, entries frozen as pinned with the shift that takes their
    keys to their place in the kept cache, the window keys that move in place, and the offsets after."""

    begin: int
    count: int
    """Logical pages that leave the window (released or frozen)."""
    released: list[int]
    frozen: list[tuple[int, int]]
    rotations: list[Rotation]
    base: int
    head_offset: int


class WindowState:
    """One sequence's window: which of its tokens are kept, where they live, their positions.

    The page table is the head's pages (sinks, or the system prompt, whichever is longer), then
    the pinned pages (the latest user turn's, frozen as the window passes them), then the window's.
    The window shows the tokens from `begin` on, so its oldest page may be partly hidden (the
    head's last page is the window's first while its tail is still in view)."""

    __slots__ = (
        "anchors",
        "base",
        "begin",
        "head_offset",
        "head_pages",
        "moved",
        "page_size",
        "pin",
        "pinned",
        "sinks",
        "spec",
    )

    def __init__(self, spec: WindowSpec, page_size: int, carry: Carry | None = None) -> None:
        self.spec = spec
        self.page_size = page_size
        self.sinks = max(spec.sinks, carry.head if carry is not None else 0)
        """Tokens kept from the first on (the sinks, widened to the system prompt)."""
        self.head_pages = -(-self.sinks // page_size)
        self.pin: tuple[int, int] | None = None
        """Logical pages `[first, last]` of the latest user turn, kept whole."""
        if carry is not None and carry.pin_end > carry.pin_start:
            first = max(carry.pin_start // page_size, self.head_pages)
            last = (carry.pin_end - 1) // page_size
            self.pin = (first, last) if first <= last else None
        self.reset()

    def copy(self) -> WindowState:
        """The same window for a sibling choice that shares this sequence's pages."""
        twin = WindowState(self.spec, self.page_size)
        twin.sinks, twin.head_pages, twin.pin = self.sinks, self.head_pages, self.pin
        twin.moved, twin.pinned, twin.begin = self.moved, self.pinned, self.begin
        twin.base, twin.head_offset, twin.anchors = self.base, self.head_offset, list(self.anchors)
        return twin

    def reset(self) -> None:
        """Back to nothing hidden (a preempted sequence recomputes from its first token)."""
        self.moved = 0
        """Logical pages after the head that left the window (released, or frozen as pinned)."""
        self.pinned = 0
        """Pinned pages frozen so far (they sit in the table between the head and the window)."""
        self.begin = self.sinks
        """The window's first token: each token attends to the head and the `size` tokens up to it."""
        self.base = 0
        """A window token's index minus the position its key is stored at."""
        self.head_offset = 0
        """A head or pinned token's stored position minus its place in the kept cache."""
        self.anchors: list[int] = []
        """Once a token is hidden: pages holding the head's and pinned pages' keys at their places
        in the kept cache (one per such table entry, in order), which their attended keys are
        rotated from at each step: never rotated in place, so rounding never builds up."""

    @property
    def slid(self) -> bool:
        """True once a token is hidden: the page table no longer holds the tokens as a prefix."""
        return self.begin > self.sinks

    @property
    def kept_tokens(self) -> int:
        """Tokens kept outside the window (the head and the pinned pages)."""
        return self.sinks + self.pinned * self.page_size

    def visible_begin(self) -> int:
        """The first window token attended (past the pages that left, frozen ones included)."""
        floor = (self.head_pages + self.moved) * self.page_size if self.moved else self.sinks
        return max(self.begin, floor)

    def position(self, index: int) -> int:
        """RoPE position of token `index` (a head token, or one in the window) as stored."""
        return index + self.head_offset if index < self.sinks else index - self.base

    def page_index(self, index: int) -> int:
        """Where in the page table token `index` (a head token, or one in the window) lives."""
        logical = index // self.page_size
        if logical < self.head_pages:
            return logical
        return logical - self.moved + self.pinned

    def held_pages(self, tokens: int) -> int:
        """Page-table entries for the first `tokens` tokens (those slid out excluded)."""
        return -(-tokens // self.page_size) - self.moved + self.pinned

    def visible_runs(self, pages: list[int], tokens: int) -> list[PageRun]:
        """The kept part of the first `tokens` tokens as runs of slots: head, pinned, window."""
        ps = self.page_size
        if not self.slid:
            return page_runs(pages, tokens, ps)
        first = self.visible_begin()
        low = first // ps * ps
        window = page_runs(pages[self.page_index(first) :], tokens - low, ps) if first < tokens else []
        if window:  # the oldest page's hidden slots are skipped
            window[0] = PageRun(window[0].first_page, window[0].tokens - (first - low), first - low)
        pinned = pages[self.head_pages : self.head_pages + self.pinned]
        return page_runs(pages, self.sinks, ps) + page_runs(pinned, len(pinned) * ps, ps) + window

    def room(self, computed: int, keep: int = 0) -> int:
        """Tokens that may join `computed` ones in one chunk: the chunk's last token sees at most
        `size` window tokens, and the first keeps at least `keep` before it."""
        size = self.spec.size
        return max(size - keep, self.sinks + size - computed)

    def plan_slide(self, last: int, computed: int) -> SlidePlan | None:
        """What the window does so that token `last` attends to the head and the `size` tokens up
        to it: the pages wholly before the window leave (released, or frozen when they hold the
        latest user turn, as soon as it is partly out of view), the window keys move back a page
        when a page leaves, and the head's keys move so their distance to each query is the one
        they have in the kept cache. None when nothing changes. Pure; `commit` does it."""
        begin = max(self.begin, last - self.spec.size + 1)
        if begin <= self.sinks:
            return None
        ps, pin = self.page_size, self.pin
        first = self.head_pages + self.pinned  # table index of the oldest window page after the head
        frozen: list[tuple[int, int]] = []
        released: list[int] = []
        count = 0
        while True:
            logical = self.head_pages + self.moved + count
            if (logical + 1) * ps > computed:
                break
            if pin is not None and pin[0] <= logical <= pin[1]:
                if begin <= logical * ps:
                    break
                frozen.append((first + count, logical))
            elif begin >= (logical + 1) * ps:
                released.append(first + count)
            else:
                break
            count += 1
        moved, pinned = self.moved + count, self.pinned + len(frozen)
        shown = max(begin, (self.head_pages + moved) * ps if moved else self.sinks)
        low = shown // ps * ps
        kept = self.sinks + pinned * ps
        # Window keys sit a page below the kept tokens' end at the oldest page's start, so the
        # latest query stays below `kept + size`; RoPE is relative, the head follows each query.
        base, head_offset = low - kept + ps, shown - low - ps
        rotations: list[Rotation] = []
        frozen_shifts = []
        for number, (index, logical) in enumerate(frozen):
            place = self.sinks + (self.pinned + number) * ps  # the frozen page's place in the kept cache
            frozen_shifts.append((index, logical * ps - self.base - place))
        window_shift = base - self.base
        if window_shift:
            tail = self.sinks - (self.head_pages - 1) * ps
            if moved == 0 and shown < self.head_pages * ps:
                rotations.append(Rotation(self.head_pages - 1, tail, ps, window_shift))
            for index in range(first + count, self.held_pages(computed)):
                rotations.append(Rotation(index, 0, ps, window_shift))
        return SlidePlan(begin, count, released, frozen_shifts, rotations, base, head_offset)

    def commit(self, pages: list[int], plan: SlidePlan) -> list[int]:
        """Do `plan` on `pages` (in place; `anchors` for the frozen pages already appended); the
        page ids released."""
        released = [pages[index] for index in plan.released]
        for index in reversed(plan.released):
            del pages[index]
        self.pinned += plan.count - len(plan.released)
        self.moved += plan.count
        self.begin, self.base, self.head_offset = plan.begin, plan.base, plan.head_offset
        return released

    def refresh(self) -> list[tuple[int, int]]:
        """(table index, slots) of every entry whose attended keys are rotated from `anchors`."""
        ps = self.page_size
        head = [(index, min(ps, self.sinks - index * ps)) for index in range(self.head_pages)]
        return head + [(index, ps) for index in range(self.head_pages, self.head_pages + self.pinned)]

    def unpin_rotations(self, computed: int) -> list[Rotation]:
        """The window keys' move back over the pinned pages once they are dropped (a later turn
        pins its own): indices into the table without them. Pure; `unpin` does it."""
        ps, end = self.page_size, -(-computed // self.page_size) - self.moved
        shift = self.pinned * ps
        return [Rotation(index, 0, ps, shift) for index in range(self.head_pages, end)]

    def unpin(self, pages: list[int]) -> list[int]:
        """Drop the pinned pages' entries from `pages` (in place) and their anchors; their page ids."""
        first, end = self.head_pages, self.head_pages + self.pinned
        released = pages[first:end] + self.anchors[first:end]
        del pages[first:end], self.anchors[first:end]
        self.base += self.pinned * self.page_size
        self.pinned = 0
        return released
