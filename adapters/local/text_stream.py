"""A sequence's output text as it grows: UTF-8-safe, with stop strings held back until decided.

`push` returns only text that can no longer change: complete UTF-8 characters (see
`IncrementalDecoder`) that cannot be the start of a stop string. When a stop string appears,
the text before it is released and the sequence stops; the stop string itself is not part of
the output (OpenAI's behaviour). Because earlier text never ends with a possible stop-string
start, a match can only begin inside the held-back tail, so each push searches just that tail.
"""

from __future__ import annotations

from adapters.local.tokenizer import IncrementalDecoder, TextTokenizer


class TextStream:
    """Incremental detokenization plus stop-string matching for one sequence."""

    __slots__ = ("_decoder", "_pending", "_stop")

    def __init__(self, tokenizer: TextTokenizer, stop: tuple[str, ...]) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stop = tuple(s for s in stop if s)
        self._pending = ""

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a token; return (text now safe to emit, whether a stop string ended the output)."""
        self._pending += self._decoder.push(token_id)
        return self._release()

    def finish(self) -> str:
        """The sequence ended for another reason: release everything still held."""
        self._pending += self._decoder.flush()
        text, stopped = self._release()
        if stopped:
            return text
        text, self._pending = text + self._pending, ""
        return text

    def _release(self) -> tuple[str, bool]:
        pending = self._pending
        if not self._stop:
            self._pending = ""
            return pending, False
        hits = [i for i in (pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            self._pending = ""
            return pending[: min(hits)], True
        held = _longest_stop_prefix_suffix(pending, self._stop)
        cut = len(pending) - held
        self._pending = pending[cut:]
        return pending[:cut], False


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:length]):
                best = length
                break
    return best
