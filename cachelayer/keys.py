"""The canonical cache key: SHA-256 chained over fixed-size token blocks.

Every tier (memory, disk, Redis) and every process agrees on these bytes, so the layout is fixed
and documented here well enough to reproduce in another language. All integers are unsigned
32-bit little-endian (``u32``); strings are UTF-8; ``lp(x)`` is ``u32(len(x)) || x``.

Seed (the chain's root, one per model x tokenizer x tenant x block size)::

    root = SHA256(b"radixgate/kv-seed/v1" || lp(model_id) || lp(tokenizer_hash)
                  || lp(tenant_salt) || u32(block_size))

Block hashes (one per *whole* block; a trailing partial block has no key)::

    h[0] = SHA256(root   || u32(t[0]) || ... || u32(t[block_size - 1]))
    h[i] = SHA256(h[i-1] || u32(t[i*block_size]) || ... )

so ``h[i]`` names the whole prefix ``t[0 : (i+1)*block_size]``: two sequences share ``h[i]`` exactly
when they share that prefix (and model, tokenizer, tenant and block size).

Arbitrary canonical bytes (e.g. the response cache's normalised request)::

    key = SHA256(b"radixgate/bytes/v1" || root(seed, block_size=0) || lp(namespace) || payload)

Never Python's ``hash()`` or pickle: both differ between processes and versions.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DIGEST_SIZE",
    "KeySeed",
    "block_hashes",
    "bytes_key",
    "bytes_key_hasher",
    "chain_hashes",
    "seed_hash",
]

DIGEST_SIZE = 32
"""Bytes in every key (SHA-256)."""

_SEED_DOMAIN = b"radixgate/kv-seed/v1"
_BYTES_DOMAIN = b"radixgate/bytes/v1"
_U32_MAX = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class KeySeed:
    """What must differ for two identical token sequences to get different keys."""

    model_id: str
    """The served model's id (different weights never share KV)."""
    tokenizer_hash: str
    """Hash of the tokenizer and chat template that produced the token ids."""
    tenant_salt: str = ""
    """Set by the gateway per tenant, never by the client; empty when tenants share caches."""


def _u32(value: int) -> bytes:
    if not 0 <= value <= _U32_MAX:
        raise ValueError(f"value {value} does not fit in u32")
    return value.to_bytes(4, "little")


def _lp(data: bytes) -> bytes:
    return _u32(len(data)) + data


def _u32_le(tokens: Sequence[int]) -> bytes:
    try:
        packed = array("I", tokens)
    except OverflowError as exc:
        raise ValueError("token ids must lie in [0, 2**32)") from exc
    if sys.byteorder == "big":  # pragma: no cover - the layout is little-endian everywhere
        packed.byteswap()
    return packed.tobytes()


@functools.lru_cache(maxsize=4096)  # a few seeds (model x tenant) serve every request
def seed_hash(seed: KeySeed, block_size: int) -> bytes:
    """The chain's root digest for ``seed`` and ``block_size``."""
    fields = (seed.model_id, seed.tokenizer_hash, seed.tenant_salt)
    material = _SEED_DOMAIN + b"".join(_lp(field.encode()) for field in fields) + _u32(block_size)
    return hashlib.sha256(material).digest()


def chain_hashes(parent: bytes, tokens: Sequence[int], *, block_size: int) -> list[bytes]:
    """Continue a chain from ``parent`` (a root or a block hash) over the whole blocks of ``tokens``."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if len(parent) != DIGEST_SIZE:
        raise ValueError(f"parent must be a {DIGEST_SIZE}-byte digest, got {len(parent)} bytes")
    whole = len(tokens) - len(tokens) % block_size
    data = _u32_le(tokens[:whole])
    step = block_size * 4
    digests: list[bytes] = []
    previous = parent
    for offset in range(0, len(data), step):
        previous = hashlib.sha256(previous + data[offset : offset + step]).digest()
        digests.append(previous)
    return digests


def block_hashes(tokens: Sequence[int], *, block_size: int, seed: KeySeed) -> list[bytes]:
    """One 32-byte key per whole block of ``tokens``, each naming the prefix through that block."""
    return chain_hashes(seed_hash(seed, block_size), tokens, block_size=block_size)


def bytes_key(payload: bytes, *, seed: KeySeed, namespace: str) -> bytes:
    """Key for arbitrary canonical bytes (e.g. a normalised request), scoped by ``seed`` and ``namespace``."""
    return hashlib.sha256(_BYTES_DOMAIN + seed_hash(seed, 0) + _lp(namespace.encode()) + payload).digest()


def bytes_key_hasher(*, seed: KeySeed, namespace: str) -> hashlib._Hash:
    """A SHA-256 state already fed everything ``bytes_key`` hashes before the payload.

    ``h = base.copy(); h.update(payload); h.digest()`` equals ``bytes_key(payload, ...)``; a caller
    that keys many payloads under one (seed, namespace) keeps ``base`` and skips re-deriving it.
    """
    return hashlib.sha256(_BYTES_DOMAIN + seed_hash(seed, 0) + _lp(namespace.encode()))
