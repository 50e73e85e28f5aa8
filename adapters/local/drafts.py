"""Draft tokens for speculative decoding without a draft model, and how many to draft.

Two sources propose what a sequence will say next (`DRAFT_SOURCES`):

- `radix`: the prefix cache's tree. When an earlier request ran through this very context, the
  tokens it went on with are still in the tree's pages (`PrefixCache.continuation`); a repeated
  question, or a second choice of a greedy prompt, replays them.
- `prompt`: prompt lookup. The latest earlier place where the sequence's own last `n` tokens
  occur (n from `NGRAM_SIZES`, longest first), in its prompt or its output; the tokens that
  followed there are the draft. Edits of given code or text, extraction and quoting copy runs of
  their input, so those drafts are long and right.

How many tokens to draft adapts per sequence (`DraftState`): a draft accepted whole doubles the
next one (up to `max_draft_tokens`), a partly accepted one sets it to what was accepted plus one,
and a draft of which nothing was accepted halves it and pauses drafting for that sequence for a
number of steps that doubles with each consecutive miss (up to `MAX_PAUSE_STEPS`): a prompt with
nothing to copy quickly stops paying for verification rows it does not use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.local.config import DRAFT_SOURCES
from adapters.local.prefix_cache import PrefixCache

NGRAM_SIZES = (5, 4, 3, 2)
"""Suffix lengths prompt lookup matches, longest first (a 1-token match drafts mostly noise)."""
FIRST_DRAFT_TOKENS = 4
"""A sequence's first draft length, before it has an acceptance record."""
MAX_PAUSE_STEPS = 32
"""Longest pause in drafting after consecutive drafts of which nothing was accepted."""
RADIX_RETRY_STEPS = 16
"""Steps before a sequence that left every cached continuation asks the tree again."""


class NgramIndex:
    """For each n in `NGRAM_SIZES`: every n-gram of a token list that has a follower -> where its
    latest occurrence ends. Updated incrementally as the list grows (O(new tokens))."""

    __slots__ = ("_indexed", "_tables")

    def __init__(self) -> None:
        self._tables: list[dict[tuple[int, ...], int]] = [{} for _ in NGRAM_SIZES]
        self._indexed = 0
        """N-grams ending before this index are in the tables."""

    def draft(self, tokens: list[int], limit: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of `tokens`' longest matching suffix."""
        end = len(tokens)
        for stop in range(self._indexed, end):  # n-grams ending at `stop` now have a follower
            for n, table in zip(NGRAM_SIZES, self._tables, strict=True):
                if stop >= n:
                    table[tuple(tokens[stop - n : stop])] = stop
        self._indexed = end
        for n, table in zip(NGRAM_SIZES, self._tables, strict=True):
            if end >= n:
                found = table.get(tuple(tokens[end - n :]))
                if found is not None:
                    return tokens[found : found + limit]
        return []


@dataclass(slots=True)
class DraftState:
    """One sequence's drafting: its n-gram index, next draft length, pause and record."""

    max_tokens: int
    index: NgramIndex = field(default_factory=NgramIndex)
    length: int = FIRST_DRAFT_TOKENS
    misses: int = 0
    """Consecutive drafts of which nothing was accepted."""
    resume_at: int = 0
    """Output length before which this sequence does not draft (a pause)."""
    radix_at: int = 0
    """Output length before which the radix source is not asked again."""
    source: str = ""
    """Where the pending draft came from."""
    accepted: int = 0
    """Draft tokens accepted over the whole sequence (its answer's speculation hits)."""
    rejected: int = 0

    def settle(self, drafted: int, accepted: int, output_len: int) -> None:
        """Adapt the next draft length to how the last draft of `drafted` tokens fared."""
        self.accepted += accepted
        self.rejected += drafted - accepted
        if accepted == drafted:
            self.length, self.misses = min(self.max_tokens, 2 * self.length), 0
        elif accepted:
            self.length, self.misses = accepted + 1, 0
        else:
            self.misses += 1
            self.length = max(1, self.length // 2)
            self.resume_at = output_len + min(MAX_PAUSE_STEPS, 1 << self.misses)


@dataclass(slots=True)
class SourceFigures:
    """Drafts of one source since start."""

    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(slots=True, frozen=True)
class SpeculationFigures:
    """The engine's speculative decoding counters since start (a snapshot)."""

    verify_steps: int
    """Sequence-steps that verified a draft."""
    drafted_tokens: int
    accepted_tokens: int
    """Draft tokens the model agreed with (hits); `drafted - accepted` were rejected (misses)."""
    tokens_generated: int
    """Tokens the verifying sequence-steps emitted (accepted drafts plus the model's own next token)."""
    early_stops: int
    """Drafts rejected before their end (verification stopped early)."""
    sources: tuple[tuple[str, SourceFigures], ...]


class Drafter:
    """Proposes each decoding sequence's draft and keeps the engine's counters. Engine thread only."""

    def __init__(self, cache: PrefixCache, *, max_draft_tokens: int, sources: tuple[str, ...]) -> None:
        self.cache = cache
        self.max_draft_tokens = max_draft_tokens
        self.sources = tuple(s for s in DRAFT_SOURCES if s in sources)
        self._sources = {name: SourceFigures() for name in DRAFT_SOURCES}
        self._verify_steps = self._drafted = self._accepted = self._generated = self._early = 0

    def state(self) -> DraftState:
        """A new sequence's drafting state."""
        return DraftState(max_tokens=self.max_draft_tokens)

    def propose(
        self, state: DraftState, salt: str, tokens: list[int], output_len: int, room: int
    ) -> list[int]:
        """Up to `min(state.length, room)` tokens to verify after `tokens`; empty while paused or
        when no source has anything."""
        limit = min(state.length, room)
        if limit <= 0 or output_len < state.resume_at:
            return []
        for source in self.sources:
            if source == "radix":
                if output_len < state.radix_at:
                    continue
                draft = self.cache.continuation(salt, tokens, limit)
                if not draft:
                    state.radix_at = output_len + RADIX_RETRY_STEPS
                    continue
            else:
                draft = state.index.draft(tokens, limit)
                if not draft:
                    continue
            state.source = source
            return draft
        return []

    def settle(self, state: DraftState, drafted: int, accepted: int, emitted: int, output_len: int) -> None:
        """Count one verified draft: `accepted` of `drafted` agreed, `emitted` tokens came out."""
        state.settle(drafted, accepted, output_len)
        figures = self._sources[state.source]
        figures.drafts += 1
        figures.drafted_tokens += drafted
        figures.accepted_tokens += accepted
        self._verify_steps += 1
        self._drafted += drafted
        self._accepted += accepted
        self._generated += emitted
        self._early += accepted < drafted

    def figures(self) -> SpeculationFigures:
        return SpeculationFigures(
            verify_steps=self._verify_steps,
            drafted_tokens=self._drafted,
            accepted_tokens=self._accepted,
            tokens_generated=self._generated,
            early_stops=self._early,
            sources=tuple(
                (name, SourceFigures(f.drafts, f.drafted_tokens, f.accepted_tokens))
                for name, f in self._sources.items()
            ),
        )
