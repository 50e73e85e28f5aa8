"""Draft sources and the adaptive draft length, without a model."""

from __future__ import annotations

from adapters.local.drafts import MAX_PAUSE_STEPS, DraftState, NgramIndex
from cachelayer.radix import RadixTree


def test_prompt_lookup_drafts_what_followed_the_latest_match() -> None:
    index = NgramIndex()
    tokens = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6]
    # "5 6" last occurred before "7 2 3": the latest occurrence wins.
    assert index.draft(tokens, 3) == [7, 2, 3]
    tokens += [7, 8]
    # "6 7 8" (3 tokens) matches the first occurrence; a longer match beats a more recent shorter one.
    assert index.draft(tokens, 4) == [9, 1, 5, 6]
    assert index.draft([1, 2, 3, 4], 4) == []  # nothing repeats


def test_radix_continuation_follows_the_tree_past_a_partial_page() -> None:
    tree: RadixTree[int] = RadixTree(page_size=2)
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8], list(range(4)))
    assert tree.continuation([1, 2, 3], 3) == [4, 5, 6]  # ends inside a page
    assert tree.continuation([1, 2, 3, 4], 10) == [5, 6, 7, 8]
    assert tree.continuation([1, 2, 9], 3) == []  # diverged from every cached sequence
    assert tree.continuation([1, 2, 3, 4, 5, 6, 7, 8], 3) == []  # nothing cached after it
    before = tree.root.children[next(iter(tree.root.children))].last_access
    tree.insert([1, 2, 3, 4, 9, 9], [0, 1, 5])
    tree.match_prefix([1, 2, 3, 4, 9, 9])  # the newer branch is the more recently used one
    assert tree.continuation([1, 2, 3, 4], 2) == [9, 9]
    assert tree.root.children[next(iter(tree.root.children))].last_access >= before


def test_draft_length_adapts_and_misses_pause_drafting() -> None:
    state = DraftState(max_tokens=8)
    state.settle(drafted=4, accepted=4, output_len=10)
    assert state.length == 8
    state.settle(drafted=8, accepted=8, output_len=19)
    assert state.length == 8  # capped
    state.settle(drafted=8, accepted=2, output_len=22)
    assert state.length == 3 and state.misses == 0
    pauses = []
    for output_len in range(30, 38):
        state.settle(drafted=1, accepted=0, output_len=output_len)
        pauses.append(state.resume_at - output_len)
    assert pauses[:3] == [2, 4, 8] and max(pauses) == MAX_PAUSE_STEPS and state.length == 1
    assert (state.accepted, state.rejected) == (14, 14)
