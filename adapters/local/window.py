"""Sliding-window attention with attention sinks (StreamingLLM, Xiao et al. 2023) over the paged pool.

A windowed sequence keeps the K/V of its first `sinks` tokens (the attention sinks) and of its
most recent tokens, at most `size` of them (the window); every token attends to those alone, so
its memory and its attention cost stay bounded however long the conversation grows.

Layout: `Sequence.pages` is the sink pages (the first `ceil(sinks / page_size)` pages of the
sequence, of which the first `sinks` slots are attended) followed by the window's pages. The
window slides one whole page at a time: the oldest window page is released to the pool (or to
the radix cache, which may still hold it) as soon as the window plus the tokens about to be
computed would exceed `size`. Before the first slide nothing is hidden, and a windowed sequence
is exactly a dense one.

Positions: RoPE positions are assigned within the kept cache, as StreamingLLM does: sink `i` at
`i`, the window's tokens right after the sinks in order, so no position reaches `sinks + size`.
The pool keeps keys rotated (both attention paths, torch's and the C kernels, read them so);
when the window slides by `d` tokens every kept window key is rotated back by `d` in place
(`LlamaModel.shift_keys`; RoPE is a rotation, so this equals rotating the raw key at its new
position up to fp32 rounding). A page another holder shares (the radix cache, a sibling choice)
is copied before it is rotated. A key is re-rotated at most `size / page_size` times while it
stays in the window: the cost per generated token is one key's rotation per window page.

Prefill of a long prompt runs blockwise: before each chunk the window slides so that the kept
window plus the chunk fit in `size`, while keeping at least `carry` tokens before the chunk
(`window_overlap`, bounded by half the window): every chunk sees the sinks, at least that much
of the text before it, and itself causally. Memory is bounded by sinks + window + one page.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.local.attention import PageRun, page_runs
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
        """Most pages one windowed sequence holds: its sink pages, a full window, one more."""
        return -(-self.sinks // page_size) + -(-self.size // page_size) + 1

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


@dataclass(slots=True)
class SlidePlan:
    """What sliding `count` pages out of the window does, before it is done: page-table entries
    released, and entries whose keys move back (`(index, shift)`, indices into the table as it is)."""

    count: int
    released: list[int]
    rotations: list[tuple[int, int]]


class WindowState:
    """One sequence's window: which of its tokens are kept, where they live, their positions.

    The page table is the head's pages (sinks, or the system prompt, whichever is longer), then
    the pinned pages (the latest user turn's, frozen as the window passes them), then the window's."""

    __slots__ = ("head_pages", "moved", "page_size", "pin", "pinned", "sinks", "spec")

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
        self.moved = 0
        """Logical pages that left the window (released, or frozen as pinned)."""
        self.pinned = 0
        """Pinned pages frozen so far (they sit in the table between the head and the window)."""

    def copy(self) -> WindowState:
        """The same window for a sibling choice that shares this sequence's pages."""
        twin = WindowState(self.spec, self.page_size)
        twin.sinks, twin.head_pages, twin.pin = self.sinks, self.head_pages, self.pin
        twin.moved, twin.pinned = self.moved, self.pinned
        return twin

    def reset(self) -> None:
        """Back to nothing hidden (a preempted sequence recomputes from its first token)."""
        self.moved = self.pinned = 0

    @property
    def slid(self) -> bool:
        """True once the window has slid: the page table no longer holds the tokens in order."""
        return self.moved > 0

    @property
    def start(self) -> int:
        """Index of the window's first token (the head's end before any slide)."""
        return self.sinks if self.moved == 0 else (self.head_pages + self.moved) * self.page_size

    @property
    def shift(self) -> int:
        """A window token's index minus its position (the tokens hidden before it)."""
        if self.moved == 0:
            return 0
        return self.start - self.sinks - self.pinned * self.page_size

    @property
    def kept_tokens(self) -> int:
        """Tokens kept outside the window (the head and the pinned pages)."""
        return self.sinks + self.pinned * self.page_size

    def position(self, index: int) -> int:
        """RoPE position of token `index` (a head token, or one in the window) within the kept cache."""
        return index if index < self.sinks else index - self.shift

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
        """The kept part of the first `tokens` tokens as runs of consecutive pages: head, pinned, window."""
        ps = self.page_size
        if self.moved == 0:
            return page_runs(pages, tokens, ps)
        window = self.head_pages + self.pinned
        return (
            page_runs(pages[: self.head_pages], self.sinks, ps)
            + page_runs(pages[self.head_pages : window], self.pinned * ps, ps)
            + page_runs(pages[window:], tokens - self.start, ps)
        )

    def pages_to_slide(self, computed: int, incoming: int, keep: int) -> int:
        """Window pages to slide out before `incoming` tokens join `computed` ones, keeping at
        least `keep` window tokens: whole computed pages, oldest first."""
        count = 0
        start = self.start
        while computed - start + incoming > self.spec.size:
            nxt = (self.head_pages + self.moved + count + 1) * self.page_size
            if nxt > computed or computed - nxt < keep:
                break
            start = nxt
            count += 1
        return count

    def room(self, computed: int) -> int:
        """Tokens that may join the window now without another slide."""
        return self.spec.size - (computed - self.start)

    def plan_slide(self, count: int, computed: int) -> SlidePlan:
        """What sliding `count` pages out does: the oldest window pages leave (released, or frozen
        when they hold the latest user turn), and the keys of every kept page after the head whose
        position changes move back. Pure; `commit` does it."""
        ps = self.page_size
        first = self.head_pages + self.pinned  # table index of the oldest window page
        old_shift = self.shift
        released: list[tuple[int, int]] = []
        frozen: list[tuple[int, int]] = []
        for k in range(count):
            logical = self.head_pages + self.moved + k
            pinned = self.pin is not None and self.pin[0] <= logical <= self.pin[1]
            (frozen if pinned else released).append((first + k, logical))
        new_pinned = self.pinned + len(frozen)
        new_start = (self.head_pages + self.moved + count) * ps
        new_shift = new_start - self.sinks - new_pinned * ps
        rotations = []
        for number, (index, logical) in enumerate(frozen):
            # Frozen page `number` lands at position sinks + (pinned + number) pages.
            shift = logical * ps - old_shift - (self.sinks + (self.pinned + number) * ps)
            if shift:
                rotations.append((index, shift))
        held = self.held_pages(computed)
        rotations += [(index, new_shift - old_shift) for index in range(first + count, held)]
        return SlidePlan(count=count, released=[index for index, _ in released], rotations=rotations)

    def commit(self, pages: list[int], plan: SlidePlan) -> list[int]:
        """Do `plan` on `pages` (in place); the page ids released."""
        released = [pages[index] for index in plan.released]
        for index in reversed(plan.released):
            del pages[index]
        self.pinned += plan.count - len(plan.released)
        self.moved += plan.count
        return released
