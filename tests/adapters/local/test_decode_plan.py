"""How the runner plans a decode step's attention on torch's path: the rows of a multi-row step
read their own contexts in one padded call, a shared prefix once for all, and the answers are
dense attention over each row's visible tokens (windows' hidden slots included)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from adapters.local import runner as runner_module
from adapters.local.attention import decode_attention
from adapters.local.attention_plan import DecodePlan, PageRun
from adapters.local.kv_pool import KVPool
from adapters.local.loader import LoadedModel
from adapters.local.runner import ModelRunner

PAGE = 16


@pytest.fixture
def runner(tiny_model: tuple[object, LoadedModel]) -> ModelRunner:
    model = tiny_model[1].model
    pool = KVPool(model.spec, 128, PAGE, torch.float16)  # a half pool: torch attends, never the C kernels
    gen = torch.Generator().manual_seed(0)
    pool.k.copy_(torch.randn(pool.k.shape, generator=gen))
    pool.v.copy_(torch.randn(pool.v.shape, generator=gen))
    return ModelRunner(model, pool)


def dense(runner: ModelRunner, q: torch.Tensor, runs: list[PageRun]) -> torch.Tensor:
    """One row over exactly the slots its runs show (layer 0), in fp32: `[heads * dim]`."""
    k_pages, v_pages = runner.pool.k[0].float(), runner.pool.v[0].float()
    kv_heads, dim = k_pages.shape[0], k_pages.shape[3]
    slots = torch.cat([torch.arange(r.tokens) + r.first_page * PAGE + r.skip for r in runs])
    keys = k_pages.reshape(kv_heads, -1, dim)[:, slots][None]
    values = v_pages.reshape(kv_heads, -1, dim)[:, slots][None]
    out = F.scaled_dot_product_attention(q[None, :, None], keys, values, enable_gqa=True)
    return out.reshape(-1)


def answers(
    runner: ModelRunner, contexts: list[list[PageRun]], sizes: list[int] | None = None
) -> tuple[DecodePlan, torch.Tensor, torch.Tensor]:
    """The plan (`sizes`: rows of each sequence), its attention outputs and the dense ones."""
    spec = runner.model.spec
    plan = runner._decode_plan(contexts, sizes)
    q = torch.randn(len(contexts), spec.num_heads, spec.head_dim, generator=torch.Generator().manual_seed(1))
    out = decode_attention(q, runner.pool.k[0], runner.pool.v[0], plan)
    expected = torch.stack([dense(runner, q[i], runs) for i, runs in enumerate(contexts)])
    return plan, out, expected


# A long run, a scattered context, and a window's: sinks on a partial page, the oldest page partly hidden.
CONTEXTS = [
    [PageRun(0, 300)],
    [PageRun(30, 20), PageRun(40, 7)],
    [PageRun(50, 4), PageRun(61, 26, skip=6), PageRun(70, 40)],
]


def test_the_rows_of_a_step_attend_in_one_padded_call(runner: ModelRunner) -> None:
    plan, out, expected = answers(runner, CONTEXTS)
    assert plan.runs == [] and plan.gathered is not None and not plan.merge
    assert plan.gathered.rows.tolist() == [0, 1, 2]
    assert torch.allclose(out, expected, atol=2e-3)


def test_a_shared_prefix_is_read_once_and_the_rest_gathered(runner: ModelRunner) -> None:
    contexts = [[PageRun(0, 300)], [PageRun(0, 290)], [PageRun(30, 20), PageRun(40, 7)]]
    plan, out, expected = answers(runner, contexts)
    assert [(s.run, s.rows.tolist()) for s in plan.runs] == [(PageRun(0, 288), [0, 1])]
    assert plan.gathered is not None and plan.gathered.rows.tolist() == [0, 1, 2] and plan.merge
    assert torch.allclose(out, expected, atol=2e-3)


def test_rows_past_the_copy_budget_and_a_lone_row_read_long_runs_in_place(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, _, _ = answers(runner, CONTEXTS[:1])
    assert [s.run for s in plan.runs] == [PageRun(0, 300)] and plan.gathered is None  # decode windows
    kv_heads, dim = runner.pool.k.shape[1], runner.pool.k.shape[4]
    block = 2 * kv_heads * dim * runner.pool.k.element_size() * PAGE  # one page of K and V
    monkeypatch.setattr(runner_module, "GATHER_MAX_BYTES", 3 * 3 * block)  # three rows of up to three pages
    plan, out, expected = answers(runner, CONTEXTS)
    # Only the shortest row fits whole; the next keeps its long runs (none) in place, its rest gathered.
    assert [(s.run, s.rows.tolist()) for s in plan.runs] == [(PageRun(0, 300), [0])]
    assert plan.gathered is not None and plan.gathered.rows.tolist() == [1, 2] and not plan.merge
    assert torch.allclose(out, expected, atol=2e-3)


def test_a_sequences_draft_rows_are_queries_of_one_block(runner: ModelRunner) -> None:
    # A sequence verifying two drafts (three rows, each seeing up to its own position), another
    # sequence's one row; then the same beside a sequence sharing the first one's first two pages.
    drafts = [[PageRun(0, 40)], [PageRun(0, 41)], [PageRun(0, 42)]]
    plan, out, expected = answers(runner, [*drafts, [PageRun(30, 20)]], [3, 1])
    assert plan.runs == [] and plan.gathered is not None and not plan.merge
    assert plan.gathered.rows.tolist() == [[0, 1, 2], [3, 3, 3]]
    assert torch.allclose(out, expected, atol=2e-3)
    plan, out, expected = answers(runner, [[PageRun(0, 32)], [PageRun(0, 33)], [PageRun(0, 45)]], [2, 1])
    assert [(s.run, s.rows.tolist()) for s in plan.runs] == [(PageRun(0, 32), [0, 1, 2])]
    assert plan.gathered is not None and plan.merge
    assert plan.gathered.rows.tolist() == [1, 2]  # the first row's context ends with the shared run
    assert torch.allclose(out, expected, atol=2e-3)
