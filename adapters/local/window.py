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

    @property
    def max_position(self) -> int:
        """One past the highest RoPE position a windowed sequence ever uses."""
        return self.sinks + self.size

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
        if self.max_position > context_length:
            raise ValueError(f"sink_tokens + window_size must fit the model's context ({context_length})")


@dataclass(slots=True)
class Slide:
    """What one slide of a window did: the pages it released and how far positions moved back."""

    released: list[int]
    shift: int


class WindowState:
    """One sequence's window: which of its tokens are kept, where they live, their positions."""

    __slots__ = ("dropped", "page_size", "sink_pages", "spec")

    def __init__(self, spec: WindowSpec, page_size: int) -> None:
        self.spec = spec
        self.page_size = page_size
        self.sink_pages = -(-spec.sinks // page_size)
        self.dropped = 0
        """Window pages slid out so far."""

    def copy(self) -> WindowState:
        """The same window for a sibling choice that shares this sequence's pages."""
        twin = WindowState(self.spec, self.page_size)
        twin.dropped = self.dropped
        return twin

    def reset(self) -> None:
        """Back to nothing hidden (a preempted sequence recomputes from its first token)."""
        self.dropped = 0

    @property
    def shift(self) -> int:
        """Tokens hidden between the sinks and the window (a window token's index minus its position)."""
        if self.dropped == 0:
            return 0
        return (self.sink_pages + self.dropped) * self.page_size - self.spec.sinks

    @property
    def start(self) -> int:
        """Index of the window's first token (the sinks' end before any slide)."""
        return self.spec.sinks + self.shift

    def position(self, index: int) -> int:
        """RoPE position of token `index` within the kept cache."""
        return index if index < self.spec.sinks else index - self.shift

    def page_index(self, index: int) -> int:
        """Where in the sequence's page table token `index` lives (a kept token)."""
        logical = index // self.page_size
        return logical if logical < self.sink_pages else logical - self.dropped

    def held_pages(self, tokens: int) -> int:
        """Pages the page table needs for the first `tokens` tokens (those slid out excluded)."""
        return -(-tokens // self.page_size) - self.dropped

    def visible_runs(self, pages: list[int], tokens: int) -> list[PageRun]:
        """The kept part of the first `tokens` tokens, as runs of consecutive pages: sinks, then window."""
        if self.dropped == 0:
            return page_runs(pages, tokens, self.page_size)
        sinks = page_runs(pages[: self.sink_pages], self.spec.sinks, self.page_size)
        return sinks + page_runs(pages[self.sink_pages :], tokens - self.start, self.page_size)

    def pages_to_drop(self, computed: int, incoming: int, keep: int) -> int:
        """Window pages to slide out before `incoming` tokens join `computed` ones, keeping at
        least `keep` window tokens: whole computed pages, oldest first."""
        count = 0
        start = self.start
        while computed - start + incoming > self.spec.size:
            nxt = (self.sink_pages + self.dropped + count + 1) * self.page_size
            if nxt > computed or computed - nxt < keep:
                break
            start = nxt
            count += 1
        return count

    def room(self, computed: int) -> int:
        """Tokens that may join the window now without another slide."""
        return self.spec.size - (computed - self.start)

    def slide(self, pages: list[int], count: int) -> Slide:
        """Slide `count` pages out of the window: remove them from `pages` (in place), return them
        and the shift of every remaining window token's position."""
        before = self.shift
        first = self.sink_pages
        released = pages[first : first + count]
        del pages[first : first + count]
        self.dropped += count
        return Slide(released=released, shift=self.shift - before)
