"""Build, cache and call the engine's C kernels (`cpu_kernels.c`): products straight from Q4_1 and
Q8_0 weights (interleaved by 16 outputs, see `linear`), decode attention over each row's KV pages,
and RMSNorm of a few rows.

Decisions:
- The kernels are C, compiled on first use with the system's C compiler into
  `<cache_dir>/kernels/cpu_kernels-<hash>.so` (hash of the source, the compiler's version and the flags;
  written under a temporary name and renamed, so concurrent starts never load half a file) and
  called through ctypes, which releases the GIL for the call. It needs no Python or torch headers,
  so a build takes about a second.
- It links OpenMP by soname; torch has already loaded its own `libgomp.so.1` when the kernel is
  loaded, so the dynamic linker binds the kernel to that one: one thread pool, not two spinning
  against each other.
- Anything missing (no compiler, not x86-64 Linux, a CPU without AVX-512F, a failed build) makes
  `load_kernel` return None with the reason logged once, and the model runs the same GGUF through
  torch's kernels (decode rows on packed weights, see `stock_linear`) and torch's attention: the
  path of every host without AVX-512, which `c_kernels = false` forces on any host (the tests run
  it). Nothing here is needed for correctness, only for speed; what each kernel still wins over
  torch's is measured in `benchmarks/results/engine_quantized.md`.
- `portable=True` builds the same source against SIMDe (`simde-py`, a dev dependency), which
  implements the AVX-512 intrinsics with the host's own instructions (`cpu_kernels_portable.h`), so
  the kernels' tests run on every x86-64 host, not only where AVX-512 is. On the AMD Zen 3 (AVX2)
  its decode steps take 1.2-1.9x torch's path's time at one row and 1.3-3.3x at 16, so the engine
  never loads it; `-march=native` makes it host-specific, so the CPU's flags are in its cache key.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_kernels.c")
PORTABLE_HEADER = SOURCE.with_name("cpu_kernels_portable.h")
FLAGS = ("-O3", "-fPIC", "-shared", "-fopenmp", "-lm")
# -O2 (after FLAGS' -O3, so it wins): SIMDe's headers compile in 11 s instead of 30, products as fast.
PORTABLE_FLAGS = ("-O2", "-march=native", "-DRADIXGATE_PORTABLE", "-Wno-psabi")
BUILD_TIMEOUT_S = 120.0
KERNEL_DIR = "kernels"

logger = logging.getLogger(__name__)

_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float


class CpuKernels:
    """The loaded kernel library (fp32 activations): products with packed Q4_1 and Q8_0 weights,
    decode attention, RMSNorm."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._matmul = library.q4_1_matmul
        self._matmul.argtypes = [_P, _I, _I, _I, _P, _P, _P, _I, _P, _I, _I, _I]
        self._matmul.restype = _I
        self._q8_matmul = library.q8_0_matmul
        self._q8_matmul.argtypes = [_P, _I, _I, _I, _P, _P, _I, _P, _I, _I]
        self._q8_matmul.restype = _I
        self._rms_norm = library.rms_norm
        self._rms_norm.argtypes = [_P, _I, _I, _I, _P, _F, _P, _I]
        self._rms_norm.restype = None
        self._attention = library.decode_attention
        self._attention.argtypes = [_P, _I, _I, _I, _I, _P, _P, _I, _L, _P, _I, _F, _P, _I]
        self._attention.restype = _I
        self._prefill_attention = library.prefill_attention
        self._prefill_attention.argtypes = [_P, _I, _I, _I, _I, _P, _P, _I, _L, _P, _I, _F, _P, _I]
        self._prefill_attention.restype = _I
        self.vnni = bool(library.cpu_kernels_vnni())
        """The CPU has AVX-512 VNNI: `matmul_int8` runs."""
        self._matmul_int8 = library.q4_1_matmul_q8
        self._matmul_int8.argtypes = [_P, _I, _I, _I, _P, _P, _P, _I, _P, _I, _I, _I]
        self._matmul_int8.restype = _I
        self._rope_store = library.rope_store
        self._rope_store.argtypes = [_P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I, _L, _P, _I]
        self._rope_store.restype = None
        self._swiglu = library.swiglu
        self._swiglu.argtypes = [_P, _I, _I, _I, _P, _I, _I]
        self._swiglu.restype = None

    def matmul(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        scale: torch.Tensor,
        offset: torch.Tensor,
        out: torch.Tensor,
        *,
        accumulate: bool,
    ) -> None:
        """`out (+)= x @ w.T` for `x` `[M, K]` and `out` `[M, N]` fp32, rows contiguous (any row
        stride), `w` the `[N, K]` Q4_1 weights interleaved by 16 outputs (`linear.interleave_q4_1`)."""
        _q4_1_product(self._matmul, "q4_1_matmul", x, packed, scale, offset, out, accumulate)

    def matmul_int8(
        self,
        x: torch.Tensor,
        vnni: torch.Tensor,
        scale: torch.Tensor,
        offset: torch.Tensor,
        out: torch.Tensor,
        *,
        accumulate: bool,
    ) -> None:
        """`out (+)= x @ w.T` as `matmul`, with each row of `x` quantized to int8 per block of 32
        inputs, for `w` in the VNNI layout (`linear.interleave_q4_1_vnni`). Only where `vnni`."""
        _q4_1_product(self._matmul_int8, "q4_1_matmul_q8", x, vnni, scale, offset, out, accumulate)

    def q8_matmul(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """`x @ w.T` (a new `[M, N]` tensor) for `x` `[M, K]` fp32, rows contiguous, and the Q8_0
        weights `w` `[N, K]` interleaved by 16 outputs (`linear.interleave_q8_0`)."""
        rows, k = x.shape
        outputs = packed.shape[0] * packed.shape[2]
        out = torch.empty(rows, outputs, dtype=torch.float32)
        status = self._q8_matmul(
            x.data_ptr(),
            x.stride(0),
            rows,
            k,
            packed.data_ptr(),
            scale.data_ptr(),
            outputs,
            out.data_ptr(),
            out.stride(0),
            torch.get_num_threads(),
        )
        _check("q8_0_matmul", status)
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of `x` `[M, K]` fp32 (rows contiguous, K a multiple of 16) by `weight` `[K]`."""
        rows, k = x.shape
        out = torch.empty(rows, k, dtype=torch.float32)
        self._rms_norm(x.data_ptr(), x.stride(0), rows, k, weight.data_ptr(), eps, out.data_ptr(), k)
        return out

    def rope_store(
        self,
        qkv: torch.Tensor,
        heads: int,
        positions: torch.Tensor,
        cos_half: torch.Tensor,
        sin_half: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """RoPE and the pool writes of a step's rows in one pass: `qkv` `[n, (heads + 2 kv_heads) * 64]`
        fp32 (rows contiguous, any row stride) holds each row's q, k and v heads; q and k are rotated
        by the row's position (`positions` int64 `[n]`; `cos_half`, `sin_half` `[positions, 32]`), k
        and v written to slot `slots[i]` (int64) of one layer's pool (`keys`, `values`: `[kv_heads,
        pages, page_size, 64]`, contiguous). Returns the rotated q, `[n, heads, 64]`."""
        rows = qkv.shape[0]
        kv_heads, dim = keys.shape[0], keys.shape[3]
        if dim != 64 or qkv.shape[1] != (heads + 2 * kv_heads) * dim or qkv.stride(1) != 1:
            raise ValueError(f"rope_store does not take qkv {tuple(qkv.shape)} with {heads} heads")
        q = torch.empty(rows, heads, dim, dtype=torch.float32)
        self._rope_store(
            qkv.data_ptr(),
            qkv.stride(0),
            rows,
            heads,
            kv_heads,
            positions.data_ptr(),
            cos_half.data_ptr(),
            sin_half.data_ptr(),
            q.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            dim,
            keys.stride(0),
            slots.data_ptr(),
            torch.get_num_threads(),
        )
        return q

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`silu(gate) * up` (a new `[M, F]` tensor) for `gate_up` `[M, 2F]` fp32 (rows contiguous,
        any row stride; F a multiple of 16): the gate in the first F columns, up in the rest."""
        rows, width = gate_up.shape
        ffn = width // 2
        if width % 32 != 0 or gate_up.stride(1) != 1:
            raise ValueError(f"swiglu does not take gate_up {tuple(gate_up.shape)}")
        out = torch.empty(rows, ffn, dtype=torch.float32)
        self._swiglu(
            gate_up.data_ptr(), gate_up.stride(0), rows, ffn, out.data_ptr(), ffn, torch.get_num_threads()
        )
        return out

    def decode_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, segments: torch.Tensor
    ) -> torch.Tensor:
        """`[rows, heads * d]` attention of the decode rows `q` (`[rows, heads, d]`, contiguous)
        over their own pages of one layer's pool (`keys`, `values`: `[kv_heads, pages, page_size, d]`,
        contiguous). `segments`: int32 `[S, 3]` rows of (row, first token slot, tokens), each a
        stretch of consecutive slots, rows ascending, every row at least once (`DecodePlan.segments`)."""
        status, out = _attend(self._attention, q, keys, values, segments, segments.shape[0])
        if status != 0:
            raise RuntimeError(f"decode_attention failed: status {status} (-1 out of memory, -2 bad shape)")
        return out

    def prefill_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context: torch.Tensor
    ) -> torch.Tensor:
        """`[n, heads * d]` attention of a prompt chunk's rows `q` (`[n, heads, d]`, contiguous) over
        their context in one layer's pool (`keys`, `values` as for `decode_attention`): `context`,
        int32 `[L]`, the token slots of the whole context in order, the chunk's own `n` last; row i
        sees the first `L - n + i + 1`."""
        status, out = _attend(self._prefill_attention, q, keys, values, context, context.shape[0])
        _check("prefill_attention", status)
        return out


@functools.cache
def load_kernel(cache_dir: Path, *, portable: bool = False) -> CpuKernels | None:
    """The kernel, built into `cache_dir` if needed; None (reason logged) where it cannot run.
    `portable`: the build through SIMDe that runs on any x86-64 CPU (for the tests)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        _log_unavailable(f"needs x86-64 Linux, not {platform.system()} {platform.machine()}")
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        _log_unavailable("no C compiler (cc or gcc) on PATH")
        return None
    flags: tuple[str, ...] = FLAGS
    if portable:
        try:
            import simde_py
        except ImportError:
            _log_unavailable("the portable build needs SIMDe's headers (pip install simde-py)")
            return None
        flags = (*FLAGS, *PORTABLE_FLAGS, f"-I{simde_py.get_include()}")
    try:
        library = ctypes.CDLL(str(_built(Path(compiler), cache_dir / KERNEL_DIR, flags, portable)))
    except (OSError, subprocess.SubprocessError) as exc:
        _log_unavailable(f"build or load failed: {exc}")
        return None
    if not library.cpu_kernels_supported():
        _log_unavailable("this CPU lacks AVX-512F")
        return None
    return CpuKernels(library)


def _built(compiler: Path, directory: Path, flags: tuple[str, ...], portable: bool) -> Path:
    version = subprocess.run(
        [str(compiler), "--version"], capture_output=True, text=True, check=True, timeout=BUILD_TIMEOUT_S
    ).stdout
    digest = hashlib.sha256()
    parts = [SOURCE.read_bytes(), version.encode(), " ".join(flags).encode()]
    if portable:
        parts += [PORTABLE_HEADER.read_bytes(), cpu_flags().encode()]
    for part in parts:
        digest.update(part)
    flavour = "portable-" if portable else ""
    target = directory / f"cpu_kernels-{flavour}{digest.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    logger.info("building the CPU kernels with %s; first start only, cached in %s", compiler.name, target)
    with tempfile.TemporaryDirectory(dir=directory) as staging:
        staged = Path(staging) / target.name
        done = subprocess.run(
            [str(compiler), *flags, "-o", str(staged), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise subprocess.SubprocessError(done.stderr.strip().splitlines()[-1] if done.stderr else "")
        os.replace(staged, target)
    logger.info("built the CPU kernels in %.1f s", time.monotonic() - started)
    return target


def cpu_flags() -> str:
    """The CPU's feature flags line (`/proc/cpuinfo`), which a `-march=native` build depends on."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as cpuinfo:
            return next((line for line in cpuinfo if line.startswith("flags")), "")
    except OSError:
        return ""


def _attend(
    function: Callable[..., int],
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    table: torch.Tensor,
    length: int,
) -> tuple[int, torch.Tensor]:
    """Call one of the two attention kernels (same arguments; `table` is each one's plan of the
    context: decode segments or prefill slots); returns its status and the output."""
    rows, heads, dim = q.shape
    kv_heads = keys.shape[0]
    out = torch.empty(rows, heads * dim, dtype=torch.float32)
    status = function(
        q.data_ptr(),
        rows,
        heads,
        kv_heads,
        dim,
        keys.data_ptr(),
        values.data_ptr(),
        dim,
        keys.stride(0),
        table.data_ptr(),
        length,
        dim**-0.5,
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return status, out


def _q4_1_product(
    function: Callable[..., int],
    name: str,
    x: torch.Tensor,
    weights: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    out: torch.Tensor,
    accumulate: bool,
) -> None:
    """Call one of the two Q4_1 product kernels (same arguments, their weights in their layout)."""
    rows, k = x.shape
    status = function(
        x.data_ptr(),
        x.stride(0),
        rows,
        k,
        weights.data_ptr(),
        scale.data_ptr(),
        offset.data_ptr(),
        out.shape[1],
        out.data_ptr(),
        out.stride(0),
        int(accumulate),
        torch.get_num_threads(),
    )
    _check(name, status)


def _check(kernel: str, status: int) -> None:
    if status == -1:
        raise MemoryError(f"{kernel} could not allocate its scratch")
    if status != 0:
        raise ValueError(f"{kernel} does not take these shapes (status {status})")


def _log_unavailable(reason: str) -> None:
    logger.info("CPU kernels unavailable (%s): torch's kernels run the model", reason)
