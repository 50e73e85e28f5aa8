"""A `tokenizers.Tokenizer` built from the vocabulary a GGUF model file embeds.

Only byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`: GPT-2, Llama 3, Qwen, SmolLM)
are rebuilt; they are what the embedded engine's models use. Other kinds raise a clear error and the
operator points `tokenizer` at the model's tokenizer.json instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _field_strings(reader: Any, name: str) -> list[str]:
    field = reader.fields.get(name)
    if field is None:
        return []
    return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]


def _field_scalar(reader: Any, name: str) -> str | None:
    field = reader.fields.get(name)
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode()


def tokenizer_from_gguf(path: Path) -> Any:
    """Rebuild the byte-level BPE tokenizer stored in `path` (reads metadata only, not tensors)."""
    try:
        from gguf import GGUFReader
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("a GGUF tokenizer needs the 'gguf' and 'tokenizers' packages") from exc
    reader = GGUFReader(str(path))
    kind = _field_scalar(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"{path}: GGUF tokenizer kind {kind!r} is not byte-level BPE; "
            "configure its tokenizer.json instead"
        )
    tokens = _field_strings(reader, "tokenizer.ggml.tokens")
    merges = [
        (left, right)
        for left, _, right in (m.partition(" ") for m in _field_strings(reader, "tokenizer.ggml.merges"))
    ]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer
