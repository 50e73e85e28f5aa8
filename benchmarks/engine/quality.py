"""How far decode rows on packed weights through torch's kernels (`decode_weights = "packed"`
without the C kernels, the path of every host without AVX-512), and a half-precision KV pool
(`kv_dtype`), move the model from exact fp32. Each mode is compared with the exact one.

- perplexity of a long text (`docs/architecture.md`, first `PPL_TOKENS` tokens), every token
  teacher-forced as a decode row, so every product is the mode's decode product;
- greedy agreement: 32 tokens on the 20 prompts of `int8_quality` (~1,000 tokens each), from an
  engine in each mode (so its prompt rows as `prefill_activations` says: "auto" multiplies them
  on a bfloat16 copy where the CPU has bfloat16 arithmetic);
- the answer to "What is the capital of France?" in each mode.

    .venv/bin/python -m benchmarks.engine.quality --threads 2
    .venv/bin/python -m benchmarks.engine.quality --threads 2 --kv-dtypes float32 float16 bfloat16
    .venv/bin/python -m benchmarks.engine.quality --threads 2 --kv-dtypes bfloat16 \
        --prefill-activations auto fp32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from dataclasses import replace

import torch

from adapters.local import LocalEngine, LocalEngineConfig
from adapters.local.kv_pool import KV_DTYPES, KVPool
from adapters.local.loader import LoadedModel, load_model
from adapters.local.runner import ModelRunner
from adapters.local.sampling import SamplerState, SamplingParams
from adapters.local.scheduler import ScheduledStep
from adapters.local.sequence import GenerationJob, Sequence
from adapters.local.text_stream import TextStream
from adapters.schema import ChatMessage
from benchmarks.engine.int8_quality import CONTEXT_FILE, NEW_TOKENS, _first_difference, greedy, prompts

PPL_TOKENS = 1024
QUESTION = "What is the capital of France?"


def perplexity(loaded: LoadedModel, ids: list[int], kv_dtype: torch.dtype) -> float:
    """exp(mean NLL) of `ids[2:]`, each from a decode row of one sequence fed `ids` (the first
    token is its one-token prompt, which gives no logits)."""
    model = loaded.model
    page_size = 16
    pool = KVPool(model.spec, len(ids) // page_size + 2, page_size, kv_dtype)
    runner = ModelRunner(model, pool)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    sampler = SamplerState(params, model.spec.vocab_size, ids, 0)
    job = GenerationJob(job_id=0, groups=[], params=params, salt="", sink=lambda events: None)
    seq = Sequence(job, ids, 0, sampler, TextStream(loaded.tokenizer, ()))
    seq.prompt_len = 1
    pages = pool.alloc(pool.num_pages)  # zeroed: attention reads a partial last page's empty slots
    assert pages is not None
    seq.pages = pages
    runner.run(ScheduledStep(prefills=[(seq, 1)]))
    nll = 0.0
    while seq.num_computed < len(ids) - 1:
        target = ids[seq.num_computed + 1]
        logits = runner.run(ScheduledStep(decodes=[seq])).logits[0]
        nll -= torch.log_softmax(logits.double(), dim=-1)[target].item()
    return math.exp(nll / (len(ids) - 2))


def answer(config: LocalEngineConfig, loaded: LoadedModel) -> str:
    ids = loaded.tokenizer.encode(loaded.template.render([ChatMessage(role="user", content=QUESTION)]))
    engine = LocalEngine(config, model=loaded)
    engine.start_sync()
    try:
        done = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=24, temperature=0.0)))
        return loaded.tokenizer.decode(done.token_ids)
    finally:
        engine.close_sync()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--kv-dtypes",
        nargs="+",
        choices=sorted(KV_DTYPES),
        default=["float32"],
        help="pools of the packed modes",
    )
    parser.add_argument(
        "--prefill-activations",
        nargs="+",
        choices=["auto", "fp32"],
        default=["auto"],
        help="prompt rows of the packed modes (auto: bfloat16 where the CPU multiplies it natively)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = LocalEngineConfig(threads=args.threads, c_kernels=False)
    exact = replace(base, decode_weights="fp32", kv_dtype="float32", prefill_activations="fp32")
    packed = {
        f"packed/{kv}/{prompt}": replace(
            base, decode_weights="packed", kv_dtype=kv, prefill_activations=prompt
        )
        for kv in args.kv_dtypes
        for prompt in args.prefill_activations
    }
    configs = {"fp32": exact} | packed

    def weights(config: LocalEngineConfig) -> tuple[str, str]:
        return config.decode_weights, config.prefill_activations

    models = {weights(config): load_model(config) for config in configs.values()}

    def model(mode: str) -> LoadedModel:
        return models[weights(configs[mode])]

    text_ids = model("fp32").tokenizer.encode(CONTEXT_FILE.read_text())[:PPL_TOKENS]
    batch = prompts(model("fp32"))
    answers = {mode: greedy(config, model(mode), batch) for mode, config in configs.items()}
    report: dict[str, object] = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "perplexity_tokens": len(text_ids),
        "prompts": len(batch),
        "new_tokens": NEW_TOKENS,
    }
    for mode, config in configs.items():
        pairs = list(zip(answers[mode], answers["fp32"], strict=True))
        report[mode] = {
            "perplexity": perplexity(model(mode), text_ids, KV_DTYPES[config.kv_dtype]),
            "greedy_answers_identical": sum(a == b for a, b in pairs),
            "first_different_token": [_first_difference(a, b) for a, b in pairs if a != b],
            "capital_of_france": answer(config, model(mode)),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
