"""Kept windows in the offload tiers: a windowed conversation's kept cache outlives the pool and the process.

A kept window (`window_cache.KeptWindow`: sinks, pinned turn, window, their anchors) that leaves
memory, because the pool needs its pages or more than `max_entries` wait, is saved to the KV
offload's store (`adapters.local.offload`: L2 in memory, L3 on disk, written behind by its writer
thread); the kept windows still in memory at shutdown are written to L3. A later windowed prompt
that continues the same history loads it back into free pool pages and computes only what follows:
a window hit, as when it was still in memory.

Records, in the same store and budgets as the prefix cache's pages: a manifest (the window's state
and the history's last partial page of tokens) and one encoded page (`PageCodec`) per page-table
entry and anchor. Key: the offload's chained hash of the history's whole pages (model, dtype, GGUF
and tenant salt in its seed), tagged as a window. The history fixes the window's content, its sink
tokens, window tokens and their positions, and the K/V computed for them (deeper layers' keys
depend on the tokens before the window too), so a hit reproduces exactly what the conversation
would have attended to. A lookup probes the prompt's page boundaries from the longest down.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable

import msgspec

from adapters.local.offload import L3_TIER, KVOffload
from adapters.local.window import WindowSpec, WindowState
from adapters.local.window_cache import KeptWindow

MANIFEST_VERSION = 1
_TAG = b"radixgate/window/v1"


class WindowManifest(msgspec.Struct, frozen=True, array_like=True):
    """What a stored kept window needs besides its pages' K/V."""

    version: int
    tokens: int
    """History length: the kept window stands for these tokens."""
    tail: list[int]
    """The history's tokens after its last whole page."""
    table: int
    anchors: int
    spec: tuple[int, int, int]
    """The window's (sinks, size, overlap): loaded only by a request with the same window."""
    head: int
    pin: tuple[int, int] | None
    moved: int
    pinned: int
    begin: int
    base: int
    head_offset: int


class WindowStore:
    """Kept windows saved to and loaded from the offload store. Engine thread only."""

    def __init__(self, offload: KVOffload) -> None:
        self.offload = offload
        self.page_size = offload.page_size
        self.saved = 0
        """Kept windows written to the store (on leaving memory, or at shutdown), since start."""
        self.loaded = 0
        """Kept windows loaded back from the store, since start."""
        self.misses = 0
        """Windowed prompts past the memory's kept windows that found none in the store either."""

    def save(self, entry: KeptWindow, *, disk_only: bool = False) -> bool:
        """Store `entry` (its pages still hold its K/V); `disk_only`: L3 alone (the shutdown
        flush). False when a record was refused (what was stored is found incomplete, a miss)."""
        history = array("i")
        history.frombytes(entry.history)
        key = self._manifest_key(entry.salt, history.tolist(), entry.tokens)
        if key is None:
            return False
        state = entry.window
        manifest = WindowManifest(
            version=MANIFEST_VERSION,
            tokens=entry.tokens,
            tail=history[entry.tokens // self.page_size * self.page_size : entry.tokens].tolist(),
            table=len(entry.pages),
            anchors=len(state.anchors),
            spec=(state.spec.sinks, state.spec.size, state.spec.overlap),
            head=state.sinks,
            pin=state.pin,
            moved=state.moved,
            pinned=state.pinned,
            begin=state.begin,
            base=state.base,
            head_offset=state.head_offset,
        )
        codec, cost = self.offload.codec, float(self.page_size)
        stored = True
        for number, page in enumerate(entry.pages + state.anchors):
            stored &= self._put(_page_key(key, number), codec.encode(page), cost, disk_only)
        stored &= self._put(key, msgspec.msgpack.encode(manifest), cost, disk_only)
        self.saved += stored
        return stored

    def load(
        self,
        salt: str,
        tokens: list[int],
        at_least: int,
        spec: WindowSpec,
        alloc: Callable[[int], list[int] | None],
    ) -> KeptWindow | None:
        """The longest stored kept window whose history `tokens` starts with, covering more than
        `at_least` tokens, loaded into pages from `alloc`; None when there is none (a miss)."""
        store, ps = self.offload.store, self.page_size
        keys = self.offload.keys(salt, tokens)
        least = max(at_least, spec.sinks + spec.size) // ps
        for boundary in range(len(keys), max(least, 1) - 1, -1):
            key = _tagged(keys[boundary - 1])
            if store.locate(key) is None:
                continue
            manifest = self._manifest(key)
            if manifest is None or not _fits(manifest, tokens, boundary * ps, ps, at_least, spec):
                continue
            kept = self._pages(key, manifest, alloc)
            if kept is None:
                break
            self.loaded += 1
            history = array("i", tokens[: manifest.tokens]).tobytes()
            return KeptWindow(
                salt, history, manifest.tokens, kept[: manifest.table], _state(manifest, spec, ps, kept)
            )
        self.misses += 1
        return None

    def _pages(
        self, key: bytes, manifest: WindowManifest, alloc: Callable[[int], list[int] | None]
    ) -> list[int] | None:
        """The manifest's pages decoded into fresh pool pages; None (nothing held) when one is gone."""
        pages = alloc(manifest.table + manifest.anchors)
        if pages is None:
            return None
        for number, page in enumerate(pages):
            data = self.offload.store.get(_page_key(key, number))
            if data is None or not self.offload.codec.decode_into(data, page):
                self.offload.pool.release(pages)
                self.offload.store.delete(key)
                return None
        return pages

    def _manifest(self, key: bytes) -> WindowManifest | None:
        data = self.offload.store.get(key)
        if data is None:
            return None
        try:
            manifest = msgspec.msgpack.decode(data, type=WindowManifest)
        except msgspec.DecodeError:
            manifest = None
        if manifest is None or manifest.version != MANIFEST_VERSION:
            self.offload.store.delete(key)
            return None
        return manifest

    def _manifest_key(self, salt: str, history: list[int], tokens: int) -> bytes | None:
        whole = tokens // self.page_size
        if whole == 0:
            return None
        return _tagged(self.offload.keys(salt, history[: whole * self.page_size])[-1])

    def _put(self, key: bytes, data: bytes, cost: float, disk_only: bool) -> bool:
        store = self.offload.store
        if disk_only:
            return self.offload.disk is not None and store.put_into(L3_TIER, key, data, cost=cost)
        store.put(key, data, cost=cost)
        return store.locate(key) is not None


def _tagged(chain_key: bytes) -> bytes:
    return hashlib.sha256(_TAG + chain_key).digest()


def _page_key(key: bytes, number: int) -> bytes:
    return hashlib.sha256(key + number.to_bytes(4, "little")).digest()


def _fits(
    manifest: WindowManifest, tokens: list[int], whole: int, page_size: int, at_least: int, spec: WindowSpec
) -> bool:
    """Whether the stored window, keyed by `tokens`' first `whole` tokens, continues into them and
    serves a request with `spec`."""
    return (
        at_least < manifest.tokens <= len(tokens)
        and manifest.tokens // page_size * page_size == whole
        and tokens[whole : manifest.tokens] == manifest.tail
        and manifest.spec == (spec.sinks, spec.size, spec.overlap)
    )


def _state(manifest: WindowManifest, spec: WindowSpec, page_size: int, pages: list[int]) -> WindowState:
    state = WindowState(spec, page_size)
    state.sinks, state.head_pages = manifest.head, -(-manifest.head // page_size)
    state.pin = manifest.pin
    state.moved, state.pinned, state.begin = manifest.moved, manifest.pinned, manifest.begin
    state.base, state.head_offset = manifest.base, manifest.head_offset
    state.anchors = pages[manifest.table :]
    return state
