"""The C kernels' part of the default prefill mode (`prefill_activations` "auto", or "int8"): the
rows of prompts longer than 64 tokens multiply int8-quantized activations with the Q4_1 weights
(VNNI). It keeps no fp32 copy of those weights; on these prompts its greedy answers are the exact
mode's, token for token; and batching, chunking and a cached prefix change no token in it either."""

from __future__ import annotations

from dataclasses import replace

import pytest

from adapters.local import LocalEngine
from adapters.local.linear import Q4Linear
from adapters.local.loader import LoadedModel, load_model
from tests.adapters.local.conftest import TEST_CONFIG, load_model_on_c_kernels
from tests.adapters.local.test_equivalence import chat_ids, run

pytestmark = pytest.mark.slow

INT8 = replace(TEST_CONFIG, prefill_activations="int8")


@pytest.fixture(scope="module")
def int8_model() -> LoadedModel:
    """On a CPU without VNNI the portable build's emulated VNNI products: the same C code."""
    loaded = load_model(INT8)
    layer = loaded.model.layers[0].wqkv
    if not isinstance(layer, Q4Linear) or layer.vnni is None:
        loaded = load_model_on_c_kernels(INT8, portable=True)
    return loaded


def test_int8_mode_keeps_only_the_packed_weights(int8_model: LoadedModel, loaded: LoadedModel) -> None:
    for layer in int8_model.model.layers:
        for linear in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            assert isinstance(linear, Q4Linear) and linear.weight_t is None and linear.vnni is not None
    # The exact mode holds each Q4_1 matrix as nibbles and as fp32 (~4.7x the bytes).
    assert int8_model.model.weight_bytes < loaded.model.weight_bytes / 3


def test_int8_prefill_answers_as_the_exact_mode(int8_model: LoadedModel, engine: LocalEngine) -> None:
    prompts = [
        chat_ids(int8_model, "What do radix trees store?"),
        chat_ids(int8_model, "Which entries does eviction remove?"),
    ]
    assert all(len(p) > 300 for p in prompts)  # long enough for int8 rounding to show, if it did
    int8_engine = LocalEngine(INT8, model=int8_model)
    int8_engine.start_sync()
    try:
        assert [g.token_ids for g in run(int8_engine, prompts)] == [g.token_ids for g in run(engine, prompts)]
    finally:
        int8_engine.close_sync()


def test_int8_prefill_keeps_the_engines_shortcuts_exact(int8_model: LoadedModel) -> None:
    """A long prompt's rows are int8 and a short prompt's and every decode row exact, decided per
    request, whatever shares the step (the short prompt batched into one ~300-row chunk with the
    long one stays exact), each row quantized on its own: so batching, chunking and a cached prefix
    change no token."""
    engines = [
        LocalEngine(replace(INT8, radix_cache=False), model=int8_model),
        LocalEngine(INT8, model=int8_model),
        LocalEngine(
            replace(INT8, radix_cache=False, max_prefill_tokens=100, max_idle_prefill_tokens=100),
            model=int8_model,
        ),
    ]
    for built in engines:
        built.start_sync()
    plain, cached, chunked = engines
    try:
        probe = chat_ids(int8_model, "Why do serving engines use them?")
        short = int8_model.tokenizer.encode("Eviction removes")
        alone = run(plain, [probe])[0]
        assert [g.token_ids for g in run(plain, [probe, short])] == [
            alone.token_ids,
            run(plain, [short])[0].token_ids,
        ]
        assert run(chunked, [probe])[0].token_ids == alone.token_ids
        run(cached, [chat_ids(int8_model, "What do radix trees store?")])
        hit = run(cached, [probe])[0]
        assert hit.cached_tokens >= 256 and hit.token_ids == alone.token_ids
    finally:
        for built in engines:
            built.close_sync()


def test_prefill_activations_is_checked() -> None:
    for mode in ("auto", "int8", "fp32"):
        replace(TEST_CONFIG, prefill_activations=mode).validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefill_activations"):
        replace(TEST_CONFIG, prefill_activations="int4").validate()  # type: ignore[arg-type]
