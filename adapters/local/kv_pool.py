"""The paged KV pool: fixed-size pages of keys and values, handed out by index, ref-counted.

A page holds `page_size` token slots for every layer. Page ids are what sequences keep in their
page tables and what the radix cache stores as values; the scheduler never touches tensors.

A page's reference count says who holds it: each running sequence whose page table lists it,
plus the radix cache when a finished prefix lives there. It returns to the free list when the
count drops to zero, so a sequence ending and the cache evicting may happen in either order.

Memory is allocated once but touched only as pages are used: the lowest free id is handed out
first, so a lightly loaded engine keeps reusing the same hot pages and its RSS stays small, and a
prompt's pages are usually consecutive ids, which attention reads in place. A page is zeroed
the first time it is handed out, because attention reads whole pages and masked slots must hold
finite numbers (0 * NaN would poison the softmax).

The layout is head-major, `[layers, kv_heads, pages, page_size, head_dim]`: a run of consecutive
pages is one contiguous `[tokens, head_dim]` matrix per KV head, the shape attention kernels read
fastest. Token-major (every head of a slot together) made torch's flash kernel read each head's
keys at a stride of `kv_heads * head_dim`: its attention for one decode row over 2,176 tokens, 30
layers, took 17.0 ms (bfloat16, its best split into windows) against 9.1 ms head-major on an AMD
EPYC (Zen 4).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from adapters.local.config import KVDType
from adapters.local.gguf_convert import ModelSpec

KV_DTYPES: dict[KVDType, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def kv_dtype(choice: KVDType, weights: torch.dtype, torch_attends_packed: bool) -> torch.dtype:
    """The pool's dtype for `LocalEngineConfig.kv_dtype`: "auto" is `half_kv_dtype()` where torch's
    attention serves packed decode weights (`torch_attends_packed`), else the weights' dtype."""
    if choice != "auto":
        return KV_DTYPES[choice]
    return KV_DTYPES[half_kv_dtype()] if torch_attends_packed else weights


def half_kv_dtype() -> KVDType:
    """The half type torch attends fastest in on this CPU: float16 where oneDNN reports fp16
    arithmetic (x86 AVX512-FP16, ARM fp16), else bfloat16.

    Without fp16 arithmetic torch's flash kernel converts float16 blocks the slow way: on an AMD
    EPYC (Zen 4, AVX-512 with BF16, no FP16) one decode row at 2,176 tokens took 69.7 ms a step
    on a float16 pool against 38.0 on float32 and 37.6 on bfloat16 (AVX2 code: 71.0 / 40.3 / 42.2),
    and 16 rows 844 / 478 / 395 ms. A bfloat16 value is a float32's top half, so it converts by a
    shift on any CPU. On the Intel Xeon with AVX512-FP16 and AMX float16 decodes faster (one row at
    2,176 tokens 19.8 against 25.2 ms, 16 rows alike; 2026-12-03) while bfloat16 prefills faster
    (cold 2,176 tokens 1.23-1.28 against 1.52-1.63 s, cached TTFT 0.12-0.13 against 0.18-0.19 s;
    prompt chunks there now attend their cached prefix in bfloat16,
    `attention.prefix_attention_dtype`, which takes most of that back: 1.32-1.33 s and 0.14-0.15 s).
    Decode is what a user waits on, and float16 keeps 10 mantissa bits to bfloat16's 7
    (`benchmarks/results/engine_quantized.md`)."""
    return "float16" if onednn_reports("_is_mkldnn_fp16_supported") else "bfloat16"


def onednn_reports(probe_name: str) -> bool:
    """What oneDNN's probe `torch.ops.mkldnn.<probe_name>` says; False without the probe or oneDNN."""
    probe = getattr(torch.ops.mkldnn, probe_name, None)
    try:
        return bool(probe()) if probe is not None else False
    except RuntimeError:  # a build without oneDNN
        return False


def dtype_name(dtype: torch.dtype) -> str:
    """`float16` for `torch.float16`: how configs and cache keys spell a dtype."""
    return str(dtype).removeprefix("torch.")


@dataclass(slots=True, frozen=True)
class PoolUsage:
    """Page accounting at one moment."""

    total_pages: int
    free_pages: int
    page_size: int

    @property
    def used_pages(self) -> int:
        return self.total_pages - self.free_pages


class KVPool:
    """Keys and values for every layer, `[layers, kv_heads, pages, page_size, head_dim]` each."""

    def __init__(self, spec: ModelSpec, num_pages: int, page_size: int, dtype: torch.dtype) -> None:
        shape = (spec.num_layers, spec.num_kv_heads, num_pages, page_size, spec.head_dim)
        self.k = torch.empty(shape, dtype=dtype)
        self.v = torch.empty(shape, dtype=dtype)
        self.num_pages = num_pages
        self.page_size = page_size
        # A min-heap: lowest ids first, so a sequence's pages tend to be consecutive (attended in
        # place) and a light load keeps reusing the same hot pages.
        self._free = list(range(num_pages))
        self._refs = [0] * num_pages
        self._zeroed = [False] * num_pages
        self._head_bytes: list[memoryview] | None = None  # K then V of each layer's heads, flat bytes

    @property
    def nbytes(self) -> int:
        """Bytes reserved for keys and values (touched only as pages are used)."""
        return self.k.numel() * self.k.element_size() * 2

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def usage(self) -> PoolUsage:
        """Pages in use and free."""
        return PoolUsage(total_pages=self.num_pages, free_pages=len(self._free), page_size=self.page_size)

    def refcount(self, page: int) -> int:
        """Holders of `page` (0 when free)."""
        return self._refs[page]

    def alloc(self, count: int) -> list[int] | None:
        """`count` fresh pages, each with one reference; None (and nothing taken) if too few are free."""
        if count > len(self._free):
            return None
        pages = [heapq.heappop(self._free) for _ in range(count)]
        for page in pages:
            self._refs[page] = 1
            if not self._zeroed[page]:
                self.k[:, :, page].zero_()
                self.v[:, :, page].zero_()
                self._zeroed[page] = True
        return pages

    def retain(self, pages: list[int]) -> None:
        """Add one reference to each page (a second holder of the same KV)."""
        for page in pages:
            if self._refs[page] <= 0:
                raise ValueError(f"retain of free page {page}")
            self._refs[page] += 1

    def release(self, pages: list[int]) -> None:
        """Drop one reference from each page; pages nobody holds go back to the free list."""
        for page in pages:
            refs = self._refs[page] - 1
            if refs < 0:
                raise ValueError(f"release of free page {page}")
            self._refs[page] = refs
            if refs == 0:
                heapq.heappush(self._free, page)

    @property
    def page_shape(self) -> tuple[int, ...]:
        """One page of K (or of V) across every layer: `[layers, kv_heads, page_size, head_dim]`."""
        layers, kv_heads, _, page_size, head_dim = self.k.shape
        return (layers, kv_heads, page_size, head_dim)

    @property
    def page_nbytes(self) -> int:
        """Bytes of one page's K and V together, every layer."""
        return 2 * self.k[:, :, 0].numel() * self.k.element_size()

    def page_keys(self, page: int) -> torch.Tensor:
        """A view of `page`'s keys, `page_shape`."""
        return self.k[:, :, page]

    def page_values(self, page: int) -> torch.Tensor:
        """A view of `page`'s values, `page_shape`."""
        return self.v[:, :, page]

    @staticmethod
    def slots(keys: torch.Tensor) -> torch.Tensor:
        """The pool's K or V (or one layer of it), `[..., pages, page_size, d]`, viewed as `[...,
        slots, d]`: token slot `page * page_size + i`."""
        return keys.view(*keys.shape[:-3], -1, keys.shape[-1])

    def export_page(self, page: int, header: bytes = b"") -> bytes:
        """`header`, then `page`'s K then V, every layer, as raw bytes of the pool's dtype in C order
        of `page_shape` (the header is written in place, saving a copy of the page)."""
        k_bytes, v_bytes = self._byte_views()
        half = self.page_nbytes // 2
        out = np.empty(len(header) + 2 * half, dtype=np.uint8)
        out[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        shape = k_bytes[:, :, page].shape
        out[len(header) : len(header) + half].reshape(shape)[...] = k_bytes[:, :, page]
        out[len(header) + half :].reshape(shape)[...] = v_bytes[:, :, page]
        return out.tobytes()

    def page_views(self, page: int) -> list[memoryview]:
        """`page`'s K then V, every layer and KV head, as views of the pool's memory (no copy):
        joined, they are `export_page`'s bytes. Valid while the page is not written (a stopped
        engine's pool)."""
        if self._head_bytes is None:  # built once: a flush asks for thousands of pages
            self._head_bytes = [
                memoryview(head).cast("B") for half in self._byte_views() for layer in half for head in layer
            ]
        size = self.page_nbytes // 2 // (self.k.shape[0] * self.k.shape[1])
        return [head[page * size : (page + 1) * size] for head in self._head_bytes]

    def import_page(self, page: int, data: bytes, offset: int = 0) -> None:
        """Write `export_page` bytes (starting at `offset` in `data`) into `page`."""
        k_bytes, v_bytes = self._byte_views()
        shape = k_bytes[:, :, page].shape
        half = self.page_nbytes // 2
        k_bytes[:, :, page] = np.frombuffer(data, dtype=np.uint8, count=half, offset=offset).reshape(shape)
        v_bytes[:, :, page] = np.frombuffer(data, dtype=np.uint8, count=half, offset=offset + half).reshape(
            shape
        )
        self._zeroed[page] = True

    def _byte_views(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        # numpy views of the same memory: a page copy is a plain single-threaded memcpy, where torch's
        # copy_ would wake its intra-op threads (ms of barrier waits on a busy 2-core machine).
        return self.k.view(torch.uint8).numpy(), self.v.view(torch.uint8).numpy()

    def copy_page(self, src: int, dst: int) -> None:
        """Copy one page's KV in every layer (copy-on-write of a shared partial page)."""
        self.k[:, :, dst].copy_(self.k[:, :, src])
        self.v[:, :, dst].copy_(self.v[:, :, src])
