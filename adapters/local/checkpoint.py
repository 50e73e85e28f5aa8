"""Find the model file and keep a converted copy so a warm start loads in about a second.

Reading a GGUF is slow in pure Python (the vocabulary arrays alone take seconds, dequantizing
more), so the first start writes `<cache_dir>/<sha256 of the GGUF>.<CACHE_LAYOUT>/`:

    model.safetensors   weights in our fused layout (see gguf_convert): fp32, Q4_1 ones also packed
    tokenizer.json      the `tokenizers` vocabulary, pre-tokenizer and special tokens
    meta.json           ModelSpec + SpecialTokens

The key is the file's content hash, so a replaced file never reuses a stale conversion. The
directory is written under a temporary name and renamed, so a crash never leaves half a cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from adapters.local.config import UnsupportedModelError
from adapters.local.gguf_convert import ModelSpec, read_gguf
from adapters.local.tokenizer import SpecialTokens, build_tokenizer

logger = logging.getLogger(__name__)

_HASH_CHUNK = 1 << 22
CACHE_LAYOUT = "v6"
"""Bumped whenever gguf_convert changes the tensors it writes, so old conversions are not reused."""


class _Meta(msgspec.Struct):
    spec: ModelSpec
    special: SpecialTokens


@dataclass(slots=True)
class Checkpoint:
    """A model ready to instantiate: hyperparameters, tensors (see gguf_convert) and the tokenizer."""

    spec: ModelSpec
    tensors: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    special: SpecialTokens
    sha256: str


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def load_checkpoint(path: Path, cache_dir: Path) -> Checkpoint:
    """Load `path` from the conversion cache, converting (and caching) it on a miss."""
    if not path.is_file():
        raise UnsupportedModelError(f"model file not found: {path}")
    sha = file_sha256(path)
    entry = cache_dir / f"{sha}.{CACHE_LAYOUT}"
    if (entry / "meta.json").is_file():
        meta = msgspec.json.decode((entry / "meta.json").read_bytes(), type=_Meta)
        return Checkpoint(
            spec=meta.spec,
            tensors=load_file(entry / "model.safetensors"),
            tokenizer=Tokenizer.from_file(str(entry / "tokenizer.json")),
            special=meta.special,
            sha256=sha,
        )
    started = time.monotonic()
    logger.info(
        "converting %s (%d MiB) for this engine; first start only, cached in %s",
        path.name,
        path.stat().st_size >> 20,
        entry,
    )
    contents = read_gguf(path)
    vocab = contents.vocab
    special = SpecialTokens(
        bos_id=vocab.bos_id, eos_id=vocab.eos_id, add_bos=vocab.add_bos, chat_template=vocab.chat_template
    )
    checkpoint = Checkpoint(
        spec=contents.spec,
        tensors=contents.tensors,
        tokenizer=build_tokenizer(vocab),
        special=special,
        sha256=sha,
    )
    _write_cache(entry, checkpoint)
    logger.info("converted %s in %.1f s", path.name, time.monotonic() - started)
    return checkpoint


def _write_cache(entry: Path, checkpoint: Checkpoint) -> None:
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    except OSError:
        return  # a read-only cache only costs the next start its conversion time
    try:
        save_file(checkpoint.tensors, staging / "model.safetensors")
        checkpoint.tokenizer.save(str(staging / "tokenizer.json"))
        meta = _Meta(spec=checkpoint.spec, special=checkpoint.special)
        (staging / "meta.json").write_bytes(msgspec.json.encode(meta))
        os.replace(staging, entry)
    except OSError:
        # Another process may have published the same entry first; theirs is as good as ours.
        shutil.rmtree(staging, ignore_errors=True)
