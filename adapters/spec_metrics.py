"""What SGLang and vLLM workers publish about their own speculative decoding on `/metrics`.

- vLLM (v1 engine, `--speculative-config`): counters `vllm:spec_decode_num_drafts_total` (draft
  rounds, one per verification of a request), `vllm:spec_decode_num_draft_tokens_total` and
  `vllm:spec_decode_num_accepted_tokens_total`. Each round also emits the model's own next token, so
  the tokens speculation produced are accepted + drafts.
- SGLang (`--speculative-algorithm`): gauges `sglang:spec_accept_length` (tokens per verification
  step, the model's own included) and `sglang:spec_accept_rate` (fraction of draft tokens accepted),
  also under the newer `sglang_` prefix. They are recent averages, not counts: they say how well the
  worker speculates, not how many tokens it drafted.

A worker whose metrics carry none of these does not speculate (or predates them): None.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.engine_metrics import parse_prometheus

VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
_SGLANG_SUFFIXES = ("spec_accept_length", "spec_accept_rate")


@dataclass(slots=True, frozen=True)
class UpstreamSpeculation:
    """One worker's own speculative-decoding figures, as its engine reports them."""

    engine: str
    """`vllm` or `sglang`: whose series these are."""
    drafts: int | None = None
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    accept_length: float | None = None
    """Tokens per verification step (SGLang's gauge)."""
    accept_rate: float | None = None
    """Fraction of draft tokens accepted, 0..1 (SGLang's gauge)."""


def vllm_speculation(text: str) -> UpstreamSpeculation | None:
    """vLLM's spec-decode counters, summed over their label sets (one per model or engine)."""
    found = parse_prometheus(text, (VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED_TOKENS))
    if VLLM_DRAFT_TOKENS not in found or VLLM_ACCEPTED_TOKENS not in found:
        return None
    drafts = found.get(VLLM_DRAFTS)
    return UpstreamSpeculation(
        engine="vllm",
        drafts=int(drafts) if drafts is not None else None,
        drafted_tokens=int(found[VLLM_DRAFT_TOKENS]),
        accepted_tokens=int(found[VLLM_ACCEPTED_TOKENS]),
    )


def sglang_speculation(text: str) -> UpstreamSpeculation | None:
    """SGLang's spec-decode gauges under either prefix (`sglang:` wins when both are present)."""
    names = [f"{prefix}{suffix}" for prefix in ("sglang:", "sglang_") for suffix in _SGLANG_SUFFIXES]
    found = parse_prometheus(text, names)

    def pick(suffix: str) -> float | None:
        value = found.get(f"sglang:{suffix}")
        return value if value is not None else found.get(f"sglang_{suffix}")

    length, rate = pick("spec_accept_length"), pick("spec_accept_rate")
    if length is None and rate is None:
        return None
    return UpstreamSpeculation(engine="sglang", accept_length=length, accept_rate=rate)
