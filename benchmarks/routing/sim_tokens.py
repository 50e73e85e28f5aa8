"""Tokens inside the simulated engine: the templated prompt in, plain words out."""

from __future__ import annotations

from adapters.schema import ChatMessage
from proxy.routing.tokenizing import ByteTokenizer, ChatRenderer, HFTokenizer

SEGMENT_CACHE_ENTRIES = 8192


class SimTokens:
    """Tokenizes prompts the way the gateway does and decodes the simulator's output."""

    def __init__(self, tokenizer: HFTokenizer | ByteTokenizer, chat: ChatRenderer) -> None:
        self.tokenizer = tokenizer
        self.chat_renderer = chat
        self.output_vocab = _output_vocab(tokenizer)
        # Generated ids are plain words: a table lookup decodes them (the tokenizer's decoder is slow).
        self._words = _word_table(tokenizer, self.output_vocab)
        self._segments: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode_now(text)

    def chat(self, messages: list[ChatMessage]) -> list[int]:
        """The templated prompt's tokens, one message at a time through a cache (system prompts and
        histories repeat), which is what a busy engine's tokenizer workers amortise too."""
        segments = self.chat_renderer.segments(messages)
        if segments is None:
            return self.tokenizer.encode_now(self.chat_renderer.render(messages))
        tokens: list[int] = []
        for segment in segments:
            ids = self._segments.get(segment)
            if ids is None:
                ids = self.tokenizer.encode_now(segment)
                if len(self._segments) >= SEGMENT_CACHE_ENTRIES:
                    self._segments.clear()
                self._segments[segment] = ids
            tokens += ids
        return tokens

    def detokenize(self, ids: list[int]) -> str:
        if self._words is None:
            return self.tokenizer.decode_now(ids)
        words = self._words
        return " ".join(words[i] for i in ids)


def _word_table(tokenizer: HFTokenizer | ByteTokenizer, ids: list[int]) -> dict[int, str] | None:
    """id -> word for a word-level vocabulary (whose decoder joins words with spaces), else None."""
    if isinstance(tokenizer, ByteTokenizer) or type(tokenizer.raw().model).__name__ != "WordLevel":
        return None
    return {i: tokenizer.raw().id_to_token(i) for i in ids}


def _output_vocab(tokenizer: HFTokenizer | ByteTokenizer) -> list[int]:
    """Token ids the simulator may generate: plain lowercase words, so text round-trips exactly."""
    if isinstance(tokenizer, ByteTokenizer):
        return list(b"abcdefghijklmnopqrstuvwxyz ")
    vocab: dict[str, int] = tokenizer.raw().get_vocab()
    words = sorted(i for token, i in vocab.items() if token.isascii() and token.isalpha() and token.islower())
    return words or sorted(vocab.values())
