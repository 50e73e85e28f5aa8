"""Token ids packed as native uint32 bytes, and a fast common-prefix search over such bytes.

The radix tree stores keys this way so that comparing a query against a node is a C-level
``memcmp`` of slices rather than a Python loop over tokens. (Native byte order is fine here: these
bytes never leave the process; persisted keys use ``cachelayer.keys``.)
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["TOKEN_BYTES", "common_prefix_bytes", "pack_tokens", "unpack_tokens"]

TOKEN_BYTES = 4
_FIRST_SCAN_BYTES = 256  # first chunk when galloping towards a mismatch; later chunks double

if array("I").itemsize != TOKEN_BYTES:  # pragma: no cover - every platform CPython supports today
    raise ImportError("cachelayer.token_bytes needs a 4-byte array('I') item")


def pack_tokens(tokens: Sequence[int], length: int) -> bytes:
    """The first ``length`` token ids as native uint32 bytes."""
    head = tokens if length == len(tokens) else tokens[:length]
    if isinstance(head, array) and head.typecode == "I":
        return head.tobytes()
    try:
        return array("I", head).tobytes()
    except OverflowError as exc:
        raise ValueError("token ids must lie in [0, 2**32)") from exc


def unpack_tokens(data: bytes) -> tuple[int, ...]:
    """The token ids packed in ``data``."""
    tokens = array("I")
    tokens.frombytes(data)
    return tuple(tokens)


def common_prefix_bytes(key: bytes, query: bytes, start: int, unit: int) -> int:
    """Length of the longest common prefix of ``key`` and ``query[start:]``, rounded down to ``unit``.

    Equal spans are compared as whole slices; on a mismatch we gallop over doubling chunks to the one
    holding it, then binary-search inside it, so work grows with the mismatch position, not the key.
    """
    if query.startswith(key, start):  # the common case: the whole node matches, compared in place
        return len(key)
    limit = min(len(key), len(query) - start)
    limit -= limit % unit
    if key[:limit] == query[start : start + limit]:
        return limit
    lo, step = 0, max(unit, _FIRST_SCAN_BYTES - _FIRST_SCAN_BYTES % unit)
    while True:
        hi = min(lo + step, limit)
        if key[lo:hi] != query[start + lo : start + hi]:
            break
        lo, step = hi, step * 2
    good, bad = lo // unit, hi // unit  # units known to agree, units known to disagree
    while bad - good > 1:
        mid = (good + bad) // 2
        if key[lo : mid * unit] == query[start + lo : start + mid * unit]:
            good = mid
        else:
            bad = mid
    return good * unit
