"""The model's tokenizer, built from GGUF metadata, and UTF-8-safe incremental decoding.

Decisions:
- Only byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`, which Llama 3, SmolLM,
  Qwen-style Llama GGUFs use) are built; a SentencePiece vocabulary is refused clearly.
- The split before BPE follows `tokenizer.ggml.pre` the way llama.cpp does: "smollm" splits every
  digit (SmolLM2's own tokenizer.json: `Digits(individual_digits=True)` + GPT-2 byte level), the
  Llama 3 family uses its regex, anything else the GPT-2 regex (as `transformers` does).
- Control tokens (type 3) are special: matched whole in text, skipped when decoding. User-defined
  tokens (type 4) are matched whole and decoded as text.
- Decoding a byte-level vocabulary is concatenating each token's bytes, so streaming decodes with
  an incremental UTF-8 decoder: a partial multi-byte character is held back until it completes,
  and the streamed text equals the one-shot decode.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from adapters.local.config import UnsupportedModelError
from adapters.local.gguf_convert import VocabSpec

_CONTROL = 3
_USER_DEFINED = 4
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_BY_PRE = {name: _LLAMA3_SPLIT for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "falcon3")}


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's map from each byte to the printable character that spells it in the vocabulary."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def build_tokenizer(vocab: VocabSpec) -> Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to the GGUF's vocabulary."""
    if vocab.model != "gpt2":
        raise UnsupportedModelError(
            f"tokenizer model {vocab.model!r} is not supported; only byte-level BPE ('gpt2') vocabularies are"
        )
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    ids = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(vocab.tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    tokenizer = Tokenizer(BPE(vocab=ids, merges=merges, fuse_unk=False))  # type: ignore[arg-type]
    tokenizer.pre_tokenizer = _pre_tokenizer(vocab.pre)
    tokenizer.decoder = decoders.ByteLevel()
    types = vocab.token_types or [1] * len(vocab.tokens)
    tokenizer.add_special_tokens(
        [
            AddedToken(tok, normalized=False, special=True)
            for tok, kind in zip(vocab.tokens, types, strict=True)
            if kind == _CONTROL and set(tok) <= alphabet
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(tok, normalized=False, special=False)
            for tok, kind in zip(vocab.tokens, types, strict=True)
            if kind == _USER_DEFINED
        ]
    )
    return tokenizer


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    split = _SPLIT_BY_PRE.get(pre)
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


@dataclass(slots=True, frozen=True)
class SpecialTokens:
    """Ids the engine needs besides the vocabulary; persisted next to tokenizer.json."""

    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    chat_template: str | None


class TextTokenizer:
    """Encode prompts, decode completions, and spell tokens as bytes for logprobs."""

    def __init__(self, tokenizer: Tokenizer, special: SpecialTokens) -> None:
        self.tokenizer = tokenizer
        self.special = special
        spelling = {c: b for b, c in byte_alphabet().items()}
        added = tokenizer.get_added_tokens_decoder()
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)
        table: list[bytes] = []
        for i in range(size):
            piece = tokenizer.id_to_token(i) or ""
            if i in added:
                table.append(piece.encode("utf-8"))
            else:
                table.append(bytes(spelling[c] for c in piece if c in spelling))
        self.token_bytes = table

    @property
    def eos_id(self) -> int | None:
        return self.special.eos_id

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text are matched whole."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        if add_bos and self.special.add_bos and self.special.bos_id is not None:
            ids.insert(0, self.special.bos_id)
        return ids

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens skipped."""
        return self.text_bytes(ids).decode("utf-8", errors="replace")

    def text_bytes(self, ids: list[int]) -> bytes:
        """The UTF-8 bytes `ids` spell, special tokens skipped."""
        return b"".join(self.token_bytes[i] for i in ids if i not in self.special_ids)

    def piece(self, token_id: int) -> str:
        """One token as text for logprobs (partial UTF-8 shows as U+FFFD; `bytes` has the truth)."""
        return self.token_bytes[token_id].decode("utf-8", errors="replace")


class IncrementalDecoder:
    """Text of a growing token sequence, emitting only complete UTF-8 characters."""

    __slots__ = ("_decoder", "_tokenizer")

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (may be empty)."""
        if token_id in self._tokenizer.special_ids:
            return ""
        return self._decoder.decode(self._tokenizer.token_bytes[token_id])

    def flush(self) -> str:
        """End of sequence: a dangling partial character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)
