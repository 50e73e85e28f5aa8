"""A prompt step's memory: the MLP's intermediate is a chunk's largest temporary, so the attention
half's (`qkv` with the queries, keys and values it holds, the attention output) must be freed before
it is allocated (`LlamaModel._attention_half`); held, they raised a 512-token chunk's heap growth from
21-28 MiB to 31-39 (`benchmarks/results/engine_quantized.md`)."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch

from adapters.local.forward_batch import ForwardBatch, PrefillSegment
from adapters.local.kv_pool import KVPool
from adapters.local.loader import LoadedModel


def test_the_attention_half_is_freed_before_the_mlp(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = loaded.model
    attention, mlp = model._attention, model._mlp
    pending: list[weakref.ref[torch.Tensor]] = []
    held_at_mlp: list[int] = []

    def recording_attention(batch: ForwardBatch, q: torch.Tensor, *rest: Any) -> torch.Tensor:
        out = attention(batch, q, *rest)
        base = q if q._base is None else q._base  # `qkv` where the queries are a view of it
        pending.extend([weakref.ref(base), weakref.ref(out)])
        return out

    def checking_mlp(*args: Any) -> torch.Tensor:
        held_at_mlp.append(sum(ref() is not None for ref in pending))
        pending.clear()
        return mlp(*args)

    monkeypatch.setattr(model, "_attention", recording_attention)
    monkeypatch.setattr(model, "_mlp", checking_mlp)
    page, tokens = 16, 64
    pool = KVPool(loaded.spec, num_pages=tokens // page, page_size=page, dtype=torch.float32)
    pages = pool.alloc(pool.num_pages)
    assert pages is not None
    batch = ForwardBatch(
        token_ids=torch.arange(100, 100 + tokens),
        positions=torch.arange(tokens),
        slots=torch.tensor([pages[i // page] * page + i % page for i in range(tokens)]),
        logit_rows=torch.tensor([tokens - 1]),
        prefills=[PrefillSegment(start=0, length=tokens)],
    )
    with torch.inference_mode():
        logits = model.forward(batch, pool)
    assert logits.shape == (1, loaded.spec.vocab_size)
    assert held_at_mlp == [0] * loaded.spec.num_layers
