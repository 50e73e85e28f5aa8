"""Read a Llama-family GGUF file: hyperparameters, vocabulary and dequantized weights.

Decisions:
- Only `general.architecture == "llama"` (Llama 1-3 shapes, SmolLM, TinyLlama, Mistral-as-llama)
  without rope scaling; anything else is refused with `UnsupportedModelError` naming what.
- Quantized tensors are dequantized with `gguf.quants.dequantize` to fp32; the types accepted are
  listed in `SUPPORTED_QUANT_TYPES` so an unknown one fails before any work is done.
- llama.cpp's converter permutes the rows of Q and K so that rotary pairs are interleaved
  (`(2i, 2i+1)`); we undo it here, giving Hugging Face's "rotate half" layout, which is what
  `transformers` does when it loads a GGUF (checked by the parity tests).
- Q/K/V and gate/up are fused into one matrix each, so one matmul does the work of three or two,
  and every matrix is stored transposed (`[in, out]`, see `_t`). A tied embedding is stored once,
  as the transposed head; the model looks tokens up in its columns.
- A fused layer matrix whose parts are all Q4_1 is also kept packed (`<name>.packed/.scale/.offset`
  beside `<name>_t`, see `linear.Q4Linear`): 0.75 bytes per weight, interleaved by 16 outputs for
  the kernel that multiplies decode batches and short chunks; so is a Q8_0 head
  (`lm_head.packed/.scale`, `linear.Q8Linear`), with no fp32 copy. Both are stored in the kernel's
  layout, so a start does not reorder them (0.6-1 s); a matrix whose outputs are not a multiple of
  32 is kept dense. The model unpacks them to the same fp32 values `gguf` gives where the kernels
  cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

from adapters.local.config import UnsupportedModelError
from adapters.local.linear import GROUP, dequantize_q4_1, dequantize_q8_0, interleave_q4_1, interleave_q8_0

SUPPORTED_ARCHITECTURES = ("llama",)
# Names of `gguf.GGMLQuantizationType` members: `gguf` is imported only to convert a file, so a warm
# start (weights from the safetensors cache) does not keep its ~3 MB of modules resident.
SUPPORTED_QUANT_TYPES = frozenset(
    {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
)
_SUPPORTED_NAMES = ", ".join(sorted(SUPPORTED_QUANT_TYPES))
_Q4_1_BLOCK, _Q4_1_BLOCK_BYTES, _Q8_0_BLOCK_BYTES = 32, 20, 34
"""Weights per Q4_1 (and Q8_0) block, and their bytes: Q4_1 an fp16 scale, an fp16 offset and 16
bytes of 4-bit values; Q8_0 an fp16 scale and 32 int8 values."""
_LAYER_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """The hyperparameters of a Llama-family model."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_norm_eps: float
    tied_embeddings: bool


@dataclass(slots=True, frozen=True)
class VocabSpec:
    """The tokenizer as the GGUF describes it (`tokenizer.ggml.*`)."""

    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None


@dataclass(slots=True)
class GGUFContents:
    """Everything read from one GGUF file, weights already in our fused fp32 layout."""

    spec: ModelSpec
    vocab: VocabSpec
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def read_gguf(path: Path) -> GGUFContents:
    """Read and convert a GGUF file. Raises UnsupportedModelError with the reason."""
    if not path.is_file():
        raise UnsupportedModelError(f"model file not found: {path}")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise UnsupportedModelError(f"{path} is not a readable GGUF file: {exc}") from exc
    arch = str(_field(reader, "general.architecture"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path.name}: architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise UnsupportedModelError(f"{path.name}: rope scaling {scaling!r} is not supported")
    raw = {t.name: t for t in reader.tensors}
    for tensor in raw.values():
        if tensor.tensor_type.name not in SUPPORTED_QUANT_TYPES:
            raise UnsupportedModelError(
                f"{path.name}: tensor {tensor.name} uses quantization {tensor.tensor_type.name}, "
                f"which is not supported (supported: {_SUPPORTED_NAMES})"
            )
    spec = _model_spec(reader, arch, tied="output.weight" not in raw)
    return GGUFContents(spec=spec, vocab=_vocab_spec(reader), tensors=_convert_tensors(raw, spec))


def _field(reader: GGUFReader, key: str, default: object = ...) -> object:
    entry = reader.fields.get(key)
    if entry is None:
        if default is ...:
            raise UnsupportedModelError(f"GGUF metadata lacks {key!r}")
        return default
    return entry.contents()


def _int(reader: GGUFReader, key: str, default: object = ...) -> int:
    value = _field(reader, key, default)
    assert isinstance(value, int)
    return value


def _model_spec(reader: GGUFReader, arch: str, *, tied: bool) -> ModelSpec:
    hidden = _int(reader, f"{arch}.embedding_length")
    heads = _int(reader, f"{arch}.attention.head_count")
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    return ModelSpec(
        num_layers=_int(reader, f"{arch}.block_count"),
        hidden_size=hidden,
        intermediate_size=_int(reader, f"{arch}.feed_forward_length"),
        num_heads=heads,
        num_kv_heads=_int(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=_int(reader, f"{arch}.attention.key_length", hidden // heads),
        vocab_size=_int(reader, f"{arch}.vocab_size", len(tokens)),
        context_length=_int(reader, f"{arch}.context_length"),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),  # type: ignore[arg-type]
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),  # type: ignore[arg-type]
        tied_embeddings=tied,
    )


def _vocab_spec(reader: GGUFReader) -> VocabSpec:
    def optional_int(key: str) -> int | None:
        value = _field(reader, key, None)
        return value if isinstance(value, int) else None

    template = _field(reader, "tokenizer.chat_template", None)
    return VocabSpec(
        model=str(_field(reader, "tokenizer.ggml.model")),
        pre=str(_field(reader, "tokenizer.ggml.pre", "default")),
        tokens=list(reader.fields["tokenizer.ggml.tokens"].contents()),
        token_types=list(_field(reader, "tokenizer.ggml.token_type", [])),  # type: ignore[call-overload]
        merges=list(_field(reader, "tokenizer.ggml.merges", [])),  # type: ignore[call-overload]
        bos_id=optional_int("tokenizer.ggml.bos_token_id"),
        eos_id=optional_int("tokenizer.ggml.eos_token_id"),
        unk_id=optional_int("tokenizer.ggml.unknown_token_id"),
        pad_id=optional_int("tokenizer.ggml.padding_token_id"),
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None,
    )


def _convert_tensors(raw: dict[str, ReaderTensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    def load(name: str) -> torch.Tensor:
        tensor = raw.get(name)
        if tensor is None:
            raise UnsupportedModelError(f"GGUF lacks tensor {name!r}")
        values = dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(reversed([int(d) for d in tensor.shape]))
        return torch.from_numpy(values.astype(np.float32, copy=True).reshape(shape))

    out = {"norm": load("output_norm.weight")}
    head = raw.get("token_embd.weight" if spec.tied_embeddings else "output.weight")
    if head is not None and head.tensor_type.name == "Q8_0":
        qs, scale = _q8_0_parts(head)
        if _tiles(qs):
            out["lm_head.packed"], out["lm_head.scale"] = interleave_q8_0(qs, scale)
        else:
            out["lm_head_t"] = _t(dequantize_q8_0(qs, scale))
    else:
        # The model looks a tied head's embeddings up in its rows.
        out["lm_head_t"] = _t(load("token_embd.weight" if spec.tied_embeddings else "output.weight"))
    if not spec.tied_embeddings:
        out["embed"] = load("token_embd.weight")
    for i in range(spec.num_layers):
        parts = {name: raw.get(f"blk.{i}.{name}.weight") for name in _LAYER_TENSORS}
        fused = {
            "wqkv": (("attn_q", spec.num_heads), ("attn_k", spec.num_kv_heads), ("attn_v", 0)),
            "wo": (("attn_output", 0),),
            "w_gate_up": (("ffn_gate", 0), ("ffn_up", 0)),
            "w_down": (("ffn_down", 0),),
        }
        for norm in ("attn_norm", "ffn_norm"):
            out[f"layers.{i}.{norm}"] = load(f"blk.{i}.{norm}.weight")
        for fused_name, members in fused.items():
            key = f"layers.{i}.{fused_name}"
            if all(_is_q4_1(parts[name]) for name, _ in members):
                pieces = [_q4_1_parts(parts[name], heads) for name, heads in members]  # type: ignore[arg-type]
                qs, scale, offset = (torch.cat([p[index] for p in pieces], dim=0) for index in range(3))
                # The fp32 copy too, so a start reads it instead of unpacking 100M+ weights again.
                out[f"{key}_t"] = _t(dequantize_q4_1(qs, scale, offset))
                if _tiles(qs):
                    packed = interleave_q4_1(qs, scale, offset)
                    out[f"{key}.packed"], out[f"{key}.scale"], out[f"{key}.offset"] = packed
                continue
            dense = []
            for name, heads in members:
                weight = load(f"blk.{i}.{name}.weight")
                dense.append(_unpermute_rotary(weight, heads) if heads else weight)
            out[f"{key}_t"] = _t(torch.cat(dense, dim=0))
    return out


def _tiles(qs: torch.Tensor) -> bool:
    """Whether the kernels take this matrix: outputs in whole pairs of 16-output groups."""
    return qs.shape[0] % (2 * GROUP) == 0


def _is_q4_1(tensor: ReaderTensor | None) -> bool:
    return tensor is not None and tensor.tensor_type.name == "Q4_1"


def _q8_0_parts(tensor: ReaderTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor kept packed (see `linear.Q8Linear`): `qs` `[rows, cols]` int8, `scale`
    `[rows, cols/32]` fp32."""
    cols, rows = (int(d) for d in tensor.shape)
    blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(rows, cols // _Q4_1_BLOCK, _Q8_0_BLOCK_BYTES)
    scale = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16).astype(np.float32)).view(rows, -1)
    qs = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).view(rows, -1)
    return qs, scale


def _q4_1_parts(tensor: ReaderTensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_1 tensor kept packed (see `linear.Q4Linear`): `qs` `[rows, cols/2]` bytes, `scale` and
    `offset` `[rows, cols/32]` fp32; Q/K rows unpermuted like the dense weights (`heads` > 0)."""
    cols, rows = (int(d) for d in tensor.shape)
    blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(rows, cols // _Q4_1_BLOCK, _Q4_1_BLOCK_BYTES)
    scale = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16).astype(np.float32)).view(rows, -1)
    offset = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16).astype(np.float32)).view(rows, -1)
    qs = torch.from_numpy(blocks[..., 4:].copy()).view(rows, -1)
    if heads:
        qs, scale, offset = (_unpermute_rotary(t, heads) for t in (qs, scale, offset))
    return qs, scale, offset


def _t(weight: torch.Tensor) -> torch.Tensor:
    """`[in, out]` contiguous: `x @ w_t` runs MKL's NN kernel, up to 2x faster than `F.linear`'s NT
    one at the 1-16 rows of a decode step on the 2-core dev box (same speed for prefill)."""
    return weight.t().contiguous()


def _unpermute_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation of Q/K (interleaved pairs -> rotate-half halves)."""
    rows, cols = weight.shape
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, cols).transpose(1, 2).reshape(rows, cols).contiguous()
