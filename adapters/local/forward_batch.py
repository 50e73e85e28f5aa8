"""What one forward step computes: the packed rows of a batch, where their K/V go, which rows give
logits, and how each row attends. The runner builds it from scheduled sequences
(`runner.ModelRunner`); the model runs it (`model.LlamaModel.forward`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from adapters.local.attention_plan import DecodePlan, PrefixPlan


@dataclass(slots=True)
class PrefillSegment:
    """One sequence's chunk of prompt tokens inside a packed batch."""

    start: int
    """First row of the chunk in the packed batch."""
    length: int
    """New tokens in this chunk."""
    prefix: PrefixPlan | None = None
    """Where the context before the chunk (cached prefix and earlier chunks) lives; None: nowhere,
    the chunk starts the sequence."""
    int8: bool = False
    """The chunk's rows may take int8 activations: its sequence's prompt is longer than
    `linear.EXACT_PROMPT_TOKENS` (a property of the request, so batching, chunking and a cached
    prefix never change it)."""


@dataclass(slots=True)
class ForwardBatch:
    """Everything one forward step needs; built by the runner from scheduled sequences."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    """Flat KV slot (`page * page_size + offset`) each new token's K/V is written to."""
    logit_rows: torch.Tensor
    """Rows whose next-token logits are wanted, in the order the sampler reads them."""
    decode: DecodePlan | None = None
    """How rows `0..decode.count-1`, one token per decoding sequence, attend."""
    prefills: list[PrefillSegment] = field(default_factory=list)
