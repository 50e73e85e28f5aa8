"""Write tiny Llama GGUF files with random weights: fast engines for scheduler tests, and
malformed files for the loader's error paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from adapters.local.tokenizer import byte_alphabet

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2
HEAD_DIM = HIDDEN // HEADS


def tiny_vocab() -> list[str]:
    """Three control tokens, then the 256 byte-level characters, then a few merged pairs."""
    return [*SPECIALS, *byte_alphabet().values(), "Ġt", "he", "Ġthe"]


def permute_like_llama_cpp(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (rotate-half -> interleaved pairs)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_tiny_gguf(
    path: Path,
    *,
    arch: str = "llama",
    seed: int = 0,
    odd_tensor_type: GGMLQuantizationType | None = None,
) -> dict[str, np.ndarray]:
    """Write a 2-layer Llama GGUF; return its HF-layout weights (Q/K before llama.cpp's permutation).

    `odd_tensor_type` stores one tensor with that GGML type (raw bytes) to test refusals.
    """
    rng = np.random.default_rng(seed)
    vocab = tiny_vocab()
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(vocab) - len(SPECIALS)))
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    hf: dict[str, np.ndarray] = {}

    def tensor(name: str, *shape: int, scale: float = 0.2) -> np.ndarray:
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        hf[name] = value
        return value

    writer.add_tensor("token_embd.weight", tensor("token_embd.weight", len(vocab), HIDDEN, scale=1.0))
    writer.add_tensor("output_norm.weight", 1.0 + tensor("output_norm.weight", HIDDEN, scale=0.05))
    hf["output_norm.weight"] = hf["output_norm.weight"] + 1.0
    for i in range(LAYERS):
        p = f"blk.{i}."
        q = tensor(p + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        k = tensor(p + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        writer.add_tensor(p + "attn_q.weight", permute_like_llama_cpp(q, HEADS))
        writer.add_tensor(p + "attn_k.weight", permute_like_llama_cpp(k, KV_HEADS))
        writer.add_tensor(p + "attn_v.weight", tensor(p + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN))
        writer.add_tensor(p + "attn_output.weight", tensor(p + "attn_output.weight", HIDDEN, HIDDEN))
        writer.add_tensor(p + "ffn_gate.weight", tensor(p + "ffn_gate.weight", FFN, HIDDEN))
        writer.add_tensor(p + "ffn_up.weight", tensor(p + "ffn_up.weight", FFN, HIDDEN))
        writer.add_tensor(p + "ffn_down.weight", tensor(p + "ffn_down.weight", HIDDEN, FFN))
        for norm in ("attn_norm", "ffn_norm"):
            value = 1.0 + tensor(p + norm + ".weight", HIDDEN, scale=0.05)
            hf[p + norm + ".weight"] = value
            writer.add_tensor(p + norm + ".weight", value)
    if odd_tensor_type is not None:
        _, type_size = GGML_QUANT_SIZES[odd_tensor_type]
        raw = np.zeros((1, type_size), dtype=np.uint8)  # one block
        writer.add_tensor("blk.0.extra.weight", raw, raw_dtype=odd_tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf
