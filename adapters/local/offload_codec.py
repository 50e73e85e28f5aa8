"""The byte format of one offloaded KV page: a fixed header, then K and V raw (no pickle).

    magic b"RGKV" | u16 version | u8 dtype code | u8 0 | u32 layers | u32 page_size | u32 kv_heads
    | u32 head_dim | u64 payload bytes | K of every layer | V of every layer

all little-endian; K and V are `KVPool.export_page` bytes (`[layers, kv_heads, page_size, head_dim]`
in C order, the pool's dtype). The 32-byte header keeps the payload 16-byte aligned for the copy back.
A page whose header disagrees with this engine's pool (another model, dtype, page size or format
version) is refused, so a mismatched layout is a miss and never garbage in the pool. Integrity of
the bytes themselves is the store's job (the disk tier checksums every file).
"""

from __future__ import annotations

import struct

import torch

from adapters.local.kv_pool import KVPool

FORMAT_VERSION = 2
"""2: the head-major page (`KVPool`); a version-1 page (token-major) is refused, a miss."""
_MAGIC = b"RGKV"
_HEADER = struct.Struct("<4sHBBIIIIQ")
_DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


class PageCodec:
    """Encodes pool pages to bytes and back, for one pool's geometry."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        layers, kv_heads, page_size, head_dim = pool.page_shape
        self.header = _HEADER.pack(
            _MAGIC,
            FORMAT_VERSION,
            _DTYPE_CODES[pool.k.dtype],
            0,
            layers,
            page_size,
            kv_heads,
            head_dim,
            pool.page_nbytes,
        )
        self.nbytes = len(self.header) + pool.page_nbytes
        """Bytes of one encoded page."""

    def encode(self, page: int) -> bytes:
        """Pool page `page` as header + raw K and V."""
        return self.pool.export_page(page, header=self.header)

    def parts(self, page: int) -> list[bytes | memoryview]:
        """`encode(page)` as the header and views of the pool's memory, never copied (see
        `KVPool.page_views`: only while nothing writes the page)."""
        return [self.header, *self.pool.page_views(page)]

    def decode_into(self, data: bytes, page: int) -> bool:
        """Copy an encoded page into pool page `page`; False (pool untouched) when `data` does not fit."""
        if len(data) != self.nbytes or data[: len(self.header)] != self.header:
            return False
        self.pool.import_page(page, data, offset=len(self.header))
        return True
