"""Exact-match response cache: whole generation answers stored under the canonical bytes of their request.

What is cached. Only requests whose answer is fixed by the request (``is_deterministic``):
``temperature`` 0 (greedy), or a ``seed`` given. Any ``n`` qualifies, because ``n`` is part of the
key: greedy choices are all the same, and seeded engines derive every choice's seed from the
request's. A caller may also opt a sampled request in by naming a ``label`` (the cached endpoints'
``cache_key``): it then asks for the first sample to be replayed to identical requests.

The key. ``bytes_key(payload, seed=KeySeed(model, "", tenant_salt), namespace=...)`` from
``cachelayer.keys``, where

- ``payload`` is the canonical JSON of the whole request body minus ``IGNORED_FIELDS`` (fields that
  cannot change the answer's bytes): object keys sorted at every level, no whitespace, and floats
  with an integral value written as integers (``0.0`` and ``0`` are the same temperature). Every
  other field counts, unknown ones included, so a parameter radixgate has never heard of can only
  cause a miss, never a wrong hit.
- ``namespace`` is ``responses/v1/<operation>/<form>`` plus ``/<label>`` when a label is given;
  ``form`` is ``json`` or ``sse``. A streamed answer and a JSON answer are different entries: a
  stream cannot be rebuilt from a body without inventing its chunking, and a body assembled from
  chunks would not be the bytes the engine sent. For the ``json`` form ``stream_options`` is
  ignored too (it only shapes streams).
- ``tenant_salt`` keeps tenants apart; it is empty only when sharing across tenants is configured.

The value. A ``StoredResponse`` (msgpack, never pickle): the JSON body, or the stream's chunk
payloads in order (without SSE framing), so a hit replays the same chunks.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from cachelayer.keys import KeySeed, bytes_key_hasher
from cachelayer.stats import StoreSnapshot
from cachelayer.tiers import TieredStore

__all__ = [
    "IGNORED_FIELDS",
    "STREAM_ONLY_FIELDS",
    "ResponseCache",
    "StoredResponse",
    "canonical_request",
    "is_deterministic",
]

IGNORED_FIELDS = frozenset({"stream", "user", "metadata", "store"})
"""Request fields left out of the key: the form (``stream``) is keyed separately; ``user``, ``metadata``
and ``store`` label the request for the provider's bookkeeping and never change the answer."""
STREAM_ONLY_FIELDS = frozenset({"stream_options"})
"""Fields that shape only streamed answers, so they are left out of ``json``-form keys."""

_FORMAT_VERSION = 1
_NAMESPACE = "responses/v1"
MAX_KEY_PREFIXES = 4096
"""Pre-fed hash states kept (one per model x operation x form x tenant x label); beyond it they start over."""


class StoredResponse(msgspec.Struct, array_like=True, frozen=True):
    """One cached answer. Exactly one of ``body`` (JSON form) and ``chunks`` (SSE form) is used."""

    version: int
    streamed: bool
    body: bytes
    """The JSON body as the client received it (empty for a stream)."""
    chunks: list[bytes]
    """Each stream chunk's JSON payload, in order, without ``data:`` framing or ``[DONE]``."""
    stored_at: float
    """Wall-clock seconds when the answer was stored."""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def json_body(cls, body: bytes, prompt_tokens: int = 0, completion_tokens: int = 0) -> StoredResponse:
        """A non-streamed answer."""
        return cls(_FORMAT_VERSION, False, body, [], time.time(), prompt_tokens, completion_tokens)

    @classmethod
    def stream(
        cls, chunks: Sequence[bytes], prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> StoredResponse:
        """A streamed answer."""
        return cls(_FORMAT_VERSION, True, b"", list(chunks), time.time(), prompt_tokens, completion_tokens)

    @property
    def size(self) -> int:
        """Payload bytes (body or chunks)."""
        return len(self.body) + sum(len(chunk) for chunk in self.chunks)


def _number(text: str) -> float | int:
    """A JSON float, as an int when its value is integral (so ``0.0`` and ``0`` key alike)."""
    value = float(text)
    return int(value) if value.is_integer() else value


_STREAM_IGNORED = tuple(sorted(IGNORED_FIELDS))
_JSON_IGNORED = tuple(sorted(IGNORED_FIELDS | STREAM_ONLY_FIELDS))
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredResponse)
_request_decoder = msgspec.json.Decoder(dict[str, Any], float_hook=_number)
_json_encoder = msgspec.json.Encoder(order="sorted")


def is_deterministic(temperature: float | None, seed: int | None) -> bool:
    """True when the answer is fixed by the request: greedy decoding, or a seed given."""
    return seed is not None or temperature == 0


def canonical_request(raw_body: bytes, *, streamed: bool) -> bytes:
    """The canonical JSON bytes of a request body (see the module docstring).

    Raises ``ValueError`` when the body is not a JSON object.
    """
    try:
        body = _request_decoder.decode(raw_body)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the request body is not a JSON object: {exc}") from None
    for name in _STREAM_IGNORED if streamed else _JSON_IGNORED:
        if name in body:
            del body[name]
    return _json_encoder.encode(body)


class ResponseCache:
    """Keys, encodes and stores answers in a ``TieredStore``.

    ``get`` and ``put`` block on whatever the store's tiers do (disk, Redis); ``get_blocks`` and
    ``puts_block`` say when a call may, so an async caller runs only those in a worker thread.
    """

    def __init__(self, store: TieredStore, *, share_across_tenants: bool = False) -> None:
        """Wrap ``store``; with ``share_across_tenants`` every tenant reads and writes one key space."""
        self.store = store
        self.share_across_tenants = share_across_tenants
        self.blocking = any(tier.kind != "memory" for tier in store.stats().tiers)
        """Whether some tier does I/O (then ask ``get_blocks`` / ``puts_block`` per call)."""
        self.puts_block = store.puts_block
        """Whether ``put`` may wait on I/O (an event-loop caller then runs it in a thread)."""
        self._prefixes: dict[tuple[str, str, bool, str, str | None], hashlib._Hash] = {}

    def get_blocks(self, key: bytes) -> bool:
        """Whether ``get(key)`` may wait on I/O (an event-loop caller then runs it in a thread)."""
        return self.blocking and self.store.get_blocks(key)

    def key(
        self,
        raw_body: bytes,
        *,
        model: str,
        operation: str,
        streamed: bool,
        tenant_salt: str,
        label: str | None = None,
    ) -> bytes:
        """The store key of a request body (JSON bytes); ``ValueError`` when it is not a JSON object.

        Equal to ``bytes_key(canonical_request(raw_body), seed=..., namespace=...)`` (module docstring);
        the hash state over everything before the payload is kept per scope, so a request pays for
        hashing its own canonical bytes only.
        """
        scope = (model, operation, streamed, "" if self.share_across_tenants else tenant_salt, label)
        prefix = self._prefixes.get(scope)
        if prefix is None:
            prefix = self._prefix(scope)
        hasher = prefix.copy()
        hasher.update(canonical_request(raw_body, streamed=streamed))
        return hasher.digest()

    def _prefix(self, scope: tuple[str, str, bool, str, str | None]) -> hashlib._Hash:
        """The hash state over everything a key hashes before its payload, kept per scope."""
        model, operation, streamed, salt, label = scope
        namespace = f"{_NAMESPACE}/{operation}/{'sse' if streamed else 'json'}"
        if label is not None:
            namespace += "/" + label
        seed = KeySeed(model_id=model, tokenizer_hash="", tenant_salt=salt)
        if len(self._prefixes) >= MAX_KEY_PREFIXES:
            self._prefixes.clear()
        prefix = self._prefixes[scope] = bytes_key_hasher(seed=seed, namespace=namespace)
        return prefix

    def get(self, key: bytes) -> StoredResponse | None:
        """The stored answer, or None; an entry that does not decode (another version) is dropped."""
        data = self.store.get(key)
        if data is None:
            return None
        try:
            stored = _decoder.decode(data)
        except msgspec.DecodeError:
            stored = None
        if stored is None or stored.version != _FORMAT_VERSION:
            self.store.delete(key)
            return None
        return stored

    def put(self, key: bytes, response: StoredResponse, *, cost: float = 1.0) -> None:
        """Store ``response``; ``cost`` (e.g. completion tokens) weighs it for the ``adaptive`` policy."""
        self.store.put(key, _encoder.encode(response), cost=cost)

    def clear(self) -> None:
        """Drop every stored answer in every tier."""
        self.store.clear()

    def stats(self) -> StoreSnapshot:
        """The store's counters."""
        return self.store.stats()

    def close(self, deadline: float | None = None) -> None:
        """Release the store's files and connections (queued disk writes not landed by ``deadline``,
        a ``time.monotonic()`` value, are dropped)."""
        self.store.close(deadline)
