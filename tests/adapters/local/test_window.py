"""Sliding-window attention with sinks (`adapters.local.window`) against an independent reference.

The reference is StreamingLLM written out plainly on the tiny model's HF-layout weights: raw keys
kept per token, and for every token the kept set (the sinks, then the window) rotated at
positions counted within that set, attended densely. The engine's scheduler and runner must give
the same logits in fp32 while its window slides, prompts run blockwise, and pages go back to
the pool.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adapters.local.config import LocalEngineConfig
from adapters.local.forward_batch import ForwardBatch
from adapters.local.kv_pool import KVPool
from adapters.local.loader import LoadedModel, load_model
from adapters.local.model import LlamaModel
from adapters.local.prefix_cache import PrefixCache
from adapters.local.runner import ModelRunner
from adapters.local.sampling import SamplerState, SamplingParams
from adapters.local.scheduler import Scheduler
from adapters.local.sequence import GenerationJob, Sequence
from adapters.local.text_stream import TextStream
from adapters.local.window import Carry, WindowSpec
from tests.adapters.local.conftest import TEST_CONFIG
from tests.adapters.local.tiny_gguf import HEAD_DIM, HEADS, KV_HEADS, LAYERS, write_tiny_gguf

PAGE = 16
SPEC = WindowSpec(sinks=4, size=64, overlap=16)


class Reference:
    """StreamingLLM, token by token, on the tiny model's HF weights (fp32, no paging, no chunks)."""

    def __init__(self, hf: dict[str, np.ndarray]) -> None:
        self.w = {name: torch.from_numpy(value.copy()) for name, value in hf.items()}
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        self.keys: list[list[torch.Tensor]] = [[] for _ in range(LAYERS)]  # raw (unrotated), per token
        self.values: list[list[torch.Tensor]] = [[] for _ in range(LAYERS)]

    def rope(self, x: torch.Tensor, position: int) -> torch.Tensor:
        angles = position * self.inv_freq
        cos, sin = torch.cat([angles.cos()] * 2), torch.cat([angles.sin()] * 2)
        half = HEAD_DIM // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w[name]

    def step(self, token: int, kept: list[int]) -> torch.Tensor:
        """Logits of the next token; `kept`: indices of the tokens this one attends to (itself last)."""
        w = self.w
        x = w["token_embd.weight"][token]
        index = len(self.keys[0])
        assert kept[-1] == index
        for layer in range(LAYERS):
            p = f"blk.{layer}."
            h = self.norm(x, p + "attn_norm.weight")
            q = (w[p + "attn_q.weight"] @ h).view(HEADS, HEAD_DIM)
            self.keys[layer].append((w[p + "attn_k.weight"] @ h).view(KV_HEADS, HEAD_DIM))
            self.values[layer].append((w[p + "attn_v.weight"] @ h).view(KV_HEADS, HEAD_DIM))
            q = self.rope(q, len(kept) - 1)
            keys = torch.stack([self.rope(self.keys[layer][j], pos) for pos, j in enumerate(kept)])
            values = torch.stack([self.values[layer][j] for j in kept])
            group = HEADS // KV_HEADS
            out = []
            for head in range(HEADS):
                scores = keys[:, head // group] @ q[head] / math.sqrt(HEAD_DIM)
                out.append(torch.softmax(scores, 0) @ values[:, head // group])
            x = x + w[p + "attn_output.weight"] @ torch.cat(out)
            h = self.norm(x, p + "ffn_norm.weight")
            gate = F.silu(w[p + "ffn_gate.weight"] @ h) * (w[p + "ffn_up.weight"] @ h)
            x = x + w[p + "ffn_down.weight"] @ gate
        return w["token_embd.weight"] @ self.norm(x, "output_norm.weight")


class Policy:
    """The rule, written out: each token attends to the head (the sinks, or the system prompt),
    the pinned pages (the latest user turn's, kept whole once partly out of view) and the `size`
    tokens up to the last token of its step (a decode step's: itself; a prompt chunk's: its last)."""

    def __init__(self, head: int = SPEC.sinks, pin: tuple[int, int] | None = None) -> None:
        self.head = max(SPEC.sinks, head)
        first = max(pin[0] // PAGE, -(-self.head // PAGE)) if pin else 0
        self.pin_pages = range(first, (pin[1] - 1) // PAGE + 1) if pin else range(0)
        self.begin = self.head
        self.pinned: list[int] = []

    def advance(self, last: int) -> None:
        self.begin = max(self.begin, last - SPEC.size + 1)
        if self.begin > self.head:
            self.pinned += [p for p in self.pin_pages if p * PAGE < self.begin and p not in self.pinned]

    def kept(self, index: int) -> list[int]:
        if self.begin <= self.head:
            return list(range(index + 1))
        pinned = [t for page in self.pinned for t in range(page * PAGE, page * PAGE + PAGE)]
        window = [t for t in range(self.begin, index + 1) if t // PAGE not in self.pinned]
        return [*range(self.head), *pinned, *window]

    def chunk(self, reference: Reference, tokens: list[int], done: int, chunk: int) -> torch.Tensor:
        """The reference over a prompt chunk `[done, done + chunk)`; the last row's logits."""
        self.advance(done + chunk - 1)
        for index in range(done, done + chunk):
            logits = reference.step(tokens[index], self.kept(index))
        return logits


class Spy:
    """The model, recording the highest RoPE position of every step."""

    def __init__(self, model: LlamaModel) -> None:
        self.inner = model
        self.positions: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(self, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        self.positions.append(int(batch.positions.max()))
        return self.inner.forward(batch, pool)


class Harness:
    """One windowed sequence through the real scheduler and runner, its tokens forced."""

    def __init__(
        self, loaded: LoadedModel, prompt: list[int], chunk: int, pages: int = 64, carry: Carry | None = None
    ) -> None:
        self.pool = KVPool(loaded.spec, pages, PAGE, torch.float32)
        cache = PrefixCache(self.pool, enabled=True, max_cached_tokens=None, policy="lru")
        self.scheduler = Scheduler(
            self.pool, cache, max_running=4, max_prefill_tokens=chunk, max_idle_prefill_tokens=chunk
        )
        self.spy = Spy(loaded.model)
        self.runner = ModelRunner(cast(LlamaModel, self.spy), self.pool)
        params = SamplingParams(max_tokens=1)
        job = GenerationJob(job_id=1, groups=[], params=params, salt="", sink=lambda _: None, window=SPEC)
        sampler = SamplerState(params, loaded.spec.vocab_size, prompt, 0)
        self.seq = Sequence(job, prompt, 0, sampler, TextStream(loaded.tokenizer, ()))
        self.scheduler.add(self.seq, carry)
        self.chunks: list[int] = []

    def step(self) -> torch.Tensor | None:
        """Run one step; the logits when the sequence sampled."""
        step = self.scheduler.schedule()
        self.chunks += [chunk for _, chunk in step.prefills]
        out = self.runner.run(step)
        return out.logits[0] if out.sampled else None


@pytest.fixture(scope="module")
def hf_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    return write_tiny_gguf(Path(tmp_path_factory.mktemp("tinyw")) / "tiny.gguf")


def test_decode_far_past_the_window_equals_dense_attention_over_the_kept_tokens(
    tiny_model: tuple[LocalEngineConfig, LoadedModel], hf_weights: dict[str, np.ndarray]
) -> None:
    _, loaded = tiny_model
    rng = random.Random(3)
    tokens = [rng.randrange(3, 262) for _ in range(300)]
    prompt = tokens[:40]
    engine = Harness(loaded, prompt, chunk=512)
    reference = Reference(hf_weights)
    policy = Policy()
    for index in range(len(prompt) - 1):
        reference.step(tokens[index], list(range(index + 1)))
    peak_pages = 0
    for index in range(len(prompt) - 1, len(tokens) - 1):
        policy.advance(index)
        kept = policy.kept(index)
        assert len(kept) == min(index + 1, SPEC.sinks + SPEC.size)  # the sinks and exactly W tokens
        expected = reference.step(tokens[index], kept)
        got = engine.step()
        assert got is not None
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
        engine.seq.tokens.append(tokens[index + 1])
        peak_pages = max(peak_pages, engine.pool.usage().used_pages)
    assert policy.begin > 200  # the window slid far
    assert max(engine.spy.positions) < SPEC.sinks + SPEC.size
    assert engine.scheduler.windows.slid_pages >= policy.begin // PAGE - 1
    assert len(engine.seq.pages) <= SPEC.max_pages(PAGE)
    # The prompt's first pages stay cached for reuse; the sequence itself holds a bounded few.
    assert peak_pages <= SPEC.max_pages(PAGE) + len(prompt) // PAGE


def test_a_long_prompt_runs_blockwise_and_equals_the_reference(
    tiny_model: tuple[LocalEngineConfig, LoadedModel], hf_weights: dict[str, np.ndarray]
) -> None:
    """Each chunk attends to the sinks, the window before it (at least `carry` tokens) and itself,
    its last token to exactly `size` window tokens."""
    _, loaded = tiny_model
    rng = random.Random(4)
    prompt = [rng.randrange(3, 262) for _ in range(330)]
    engine = Harness(loaded, prompt, chunk=48, pages=12)
    logits = None
    while logits is None:
        logits = engine.step()
    reference = Reference(hf_weights)
    policy, done = Policy(), 0
    for chunk in engine.chunks:
        expected = policy.chunk(reference, prompt, done, chunk)
        assert done - policy.begin >= min(SPEC.carry, done - SPEC.sinks)  # the context carried over
        done += chunk
    assert done == len(prompt) and len(engine.chunks) > 6
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-4)
    assert max(engine.spy.positions) < SPEC.sinks + SPEC.size
    assert engine.pool.usage().used_pages <= SPEC.max_pages(PAGE)  # 12 pages hold a 330-token prompt


def test_shifted_keys_equal_keys_rotated_at_the_new_position(
    tiny_model: tuple[LocalEngineConfig, LoadedModel],
) -> None:
    _, loaded = tiny_model
    model = loaded.model
    pool = KVPool(loaded.spec, 4, PAGE, torch.float32)
    raw = torch.randn(LAYERS, PAGE, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    reference = Reference({})
    at = [reference.rope(raw[:, i], 300 + i) for i in range(PAGE)]
    pool.page_keys(2)[...] = torch.stack(at, dim=2)
    model.shift_keys(pool, list(range(2 * PAGE, 3 * PAGE)), 172)
    moved = torch.stack([reference.rope(raw[:, i], 128 + i) for i in range(PAGE)], dim=2)
    torch.testing.assert_close(pool.page_keys(2), moved, rtol=1e-5, atol=1e-5)


def test_window_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValueError, match="window_size"):
        WindowSpec(sinks=4, size=32).check(PAGE, 512)
    with pytest.raises(ValueError, match="window_overlap"):
        WindowSpec(sinks=4, size=64, overlap=64).check(PAGE, 512)
    with pytest.raises(ValueError, match="context"):
        WindowSpec(sinks=4, size=1024).check(PAGE, 512)
    with pytest.raises(ValueError, match="sink_tokens"):
        WindowSpec(sinks=0, size=64).check(PAGE, 512)


def test_the_c_kernels_attend_the_window_as_torch_does(c_kernel_loaded: LoadedModel) -> None:
    """The C kernels' attention (the default where they build) and torch's (every other host) over
    the same sliding window, prompt blockwise and decode far past the window: the same logits."""
    loaded = c_kernel_loaded
    stock = load_model(replace(TEST_CONFIG, c_kernels=False, decode_weights="fp32"))
    assert not stock.model.attends_in_kernel
    rng = random.Random(5)
    tokens = [rng.randrange(100, 40000) for _ in range(190)]
    runs = [Harness(model, tokens[:110], chunk=48, pages=16) for model in (loaded, stock)]
    compared = 0
    for index in range(110, len(tokens)):
        outs = [harness.step() for harness in runs]
        while outs[0] is None:
            outs = [harness.step() for harness in runs]
        a, b = outs
        assert a is not None and b is not None
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-3)
        compared += 1
        for harness in runs:
            harness.seq.tokens.append(tokens[index])
    assert compared == 80 and runs[0].scheduler.windows.slid_pages >= (len(tokens) - SPEC.size) // PAGE - 1
    assert max(runs[0].spy.positions) < SPEC.sinks + SPEC.size


def test_the_system_prompt_and_the_latest_user_turn_are_never_cut(
    tiny_model: tuple[LocalEngineConfig, LoadedModel], hf_weights: dict[str, np.ndarray]
) -> None:
    """With a carry, the head is the system prompt and the latest user turn's pages stay once the
    window passes them: still the reference's dense attention over exactly the kept tokens."""
    _, loaded = tiny_model
    rng = random.Random(6)
    tokens = [rng.randrange(3, 262) for _ in range(360)]
    prompt = tokens[:200]
    carry = Carry(head=20, pin_start=150, pin_end=170)
    engine = Harness(loaded, prompt, chunk=48, pages=16, carry=carry)
    reference = Reference(hf_weights)
    policy = Policy(carry.head, (carry.pin_start, carry.pin_end))
    logits = None
    while logits is None:
        logits = engine.step()
    done = 0
    for chunk in engine.chunks:
        expected = policy.chunk(reference, prompt, done, chunk)
        done += chunk
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-4)
    for index in range(len(prompt), len(tokens) - 1):
        engine.seq.tokens.append(tokens[index])
        policy.advance(index)
        kept = policy.kept(index)
        got = engine.step()
        assert got is not None
        # Logits reach ~30 here: 2e-4 is fp32 rounding (torch's AVX2 kernels round a little apart).
        torch.testing.assert_close(got, reference.step(tokens[index], kept), rtol=1e-5, atol=2e-4)
    assert policy.begin > carry.pin_end + SPEC.size  # the window left the turn far behind
    assert set(range(carry.head)) <= set(kept) and set(range(carry.pin_start, carry.pin_end)) <= set(kept)
    # Positions stay within the head, the pinned pages and the window.
    assert max(engine.spy.positions) < carry.head + len(policy.pinned) * PAGE + SPEC.size


def test_the_next_turn_reuses_the_kept_window(
    tiny_model: tuple[LocalEngineConfig, LoadedModel], hf_weights: dict[str, np.ndarray]
) -> None:
    """A finished windowed sequence leaves its kept cache; a prompt that continues its history
    takes it over (a window hit) and computes only the new tokens, as the reference does."""
    _, loaded = tiny_model
    rng = random.Random(7)
    tokens = [rng.randrange(3, 262) for _ in range(260)]
    first = Harness(loaded, tokens[:30], chunk=512, pages=24)
    reference = Reference(hf_weights)
    policy = Policy()
    for index in range(29):
        reference.step(tokens[index], list(range(index + 1)))
    for index in range(29, 200):
        policy.advance(index)
        reference.step(tokens[index], policy.kept(index))
        assert first.step() is not None
        first.seq.tokens.append(tokens[index + 1])
    first.scheduler.finish(first.seq, keep_kv=True)
    assert first.scheduler.windows.kept.pages > 0

    params = SamplingParams(max_tokens=1)
    job = GenerationJob(job_id=2, groups=[], params=params, salt="", sink=lambda _: None, window=SPEC)
    prompt = tokens[:240]  # the whole history, then 40 new tokens
    second = Sequence(job, prompt, 0, SamplerState(params, 262, prompt, 0), TextStream(loaded.tokenizer, ()))
    first.scheduler.add(second)
    first.seq, first.chunks = second, []
    logits = None
    while logits is None:
        logits = first.step()
    assert second.cached_tokens == 200 and first.scheduler.windows.hits == 1
    done = 200
    for chunk in first.chunks:
        expected = policy.chunk(reference, prompt, done, chunk)
        done += chunk
    assert done == 240
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-4)


def test_the_sinks_keys_do_not_drift_over_thousands_of_slides(
    tiny_model: tuple[LocalEngineConfig, LoadedModel],
) -> None:
    """The head's keys are rotated from their anchors at every step, never in place: after 2,000
    decode steps they are still their raw keys rotated at exactly their stored positions."""
    _, loaded = tiny_model
    rng = random.Random(8)
    prompt = [rng.randrange(3, 262) for _ in range(70)]
    engine = Harness(loaded, prompt, chunk=512)
    raw = torch.randn(LAYERS, SPEC.sinks, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    rope = Reference({}).rope
    engine.step()  # the prompt: its keys are the model's; the sinks' are replaced by known ones
    page = engine.seq.pages[0]
    for i in range(SPEC.sinks):
        engine.pool.page_keys(page)[:, :, i] = rope(raw[:, i], i)
    for _ in range(2000):
        engine.seq.tokens.append(3)
        step = engine.scheduler.schedule()
        for move in step.rotations:
            loaded.model.shift_keys(engine.pool, move.slots, move.shift, move.sources)
        engine.seq.num_computed += 1
    window = engine.seq.window
    assert window is not None and window.begin > 1900
    live = engine.pool.page_keys(engine.seq.pages[0])[:, :, : SPEC.sinks]
    exact = torch.stack([rope(raw[:, i], i + window.head_offset) for i in range(SPEC.sinks)], dim=2)
    torch.testing.assert_close(live, exact, rtol=1e-6, atol=1e-6)
