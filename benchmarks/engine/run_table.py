"""`benchmarks.engine.run`'s results as the markdown table it prints."""

from __future__ import annotations

from typing import Any


def table(r: dict[str, Any]) -> str:
    """The markdown table of one run's results (`run.py`'s JSON), a row per measurement."""
    rows: list[tuple[str, str, str, str]] = []
    if "prefill" in r:
        p = r["prefill"]
        cold, rate = p["cold_ttft_s"], p["prefill_tok_s"]
        rows += [
            (
                "cold prefill 2,176 tok: TTFT",
                f"{cold['ours']:.2f} s",
                f"{cold['transformers_generate']:.2f} s generate"
                f" / {cold['transformers_forward']:.2f} s forward",
                "",
            ),
            (
                "prefill tokens/s",
                f"{rate['ours']:.0f}",
                f"{rate['transformers_generate']:.0f} / {rate['transformers_forward']:.0f}",
                f"{p['prefill_speedup_vs_generate']:.2f}x / {p['prefill_speedup_vs_forward']:.2f}x (>= 1.2x)",
            ),
            *(
                [
                    (
                        "cold prefill vs llama.cpp",
                        f"{cold['ours']:.2f} s",
                        f"llama.cpp {p['llama_cpp']['cold_ttft_s']:.2f} s",
                        f"{p['llama_cpp']['prefill_speedup']:.2f}x faster (>= 1.5x)",
                    )
                ]
                if "llama_cpp" in p
                else []
            ),
            (
                "TTFT, 2,048 cached + 128 new",
                f"{p['cached_ttft_s']['ours']:.2f} s",
                f"{p['cached_ttft_s']['transformers_reused_kv']:.2f} s (KV reused by hand)",
                f"{p['cached_over_cold']:.3f} of cold (<= 0.1)",
            ),
        ]
    if "decode" in r:
        d = r["decode"]
        rows.append(
            (
                "decode ms/token at 2.2k context",
                f"{d['ms_per_token']['ours']:.1f}",
                f"{d['ms_per_token']['transformers']:.1f} (generate)",
                f"{d['ratio']:.2f}x (<= 0.5x)",
            )
        )
        if "llama_cpp" in d:
            rows.append(
                (
                    "decode vs llama.cpp",
                    f"{d['ms_per_token']['ours']:.1f}",
                    f"llama.cpp {d['llama_cpp']['ms_per_token']:.1f}",
                    f"{d['llama_cpp']['ratio']:.2f}x (<= 1x)",
                )
            )
    if "concurrency" in r:
        c = r["concurrency"]
        rows.append(
            (
                "16 streams, aggregate tok/s",
                f"{c['aggregate_tok_s']:.1f} (1 stream: {c['single_tok_s']:.1f})",
                "",
                f"{c['ratio']:.2f}x (>= 4x)",
            )
        )
        phase = c["decode_phase"]
        rows.append(
            (
                "16 streams, decode phase tok/s (after the last first token)",
                f"{phase['aggregate_tok_s']:.1f} (1 stream: {phase['single_tok_s']:.1f})",
                f"last first token {phase['last_first_token_s']:.2f} s",
                f"{phase['ratio']:.2f}x",
            )
        )
    if "few_shot" in r:
        f = r["few_shot"]
        rows.append(
            (
                "few-shot 8 x 8, tok/s",
                f"{f['radix']['tok_s']:.1f} radix / {f['no_radix']['tok_s']:.1f} no radix",
                "",
                f"{f['ratio']:.2f}x (>= 3x)",
            )
        )
    if "memory" in r:
        m, mb = r["memory"], 2**20
        limit = (m["weights_bytes"] + m["kv_pool_bytes"]) / mb + 300
        rows.append(
            ("peak RSS, 16 x 4,096 tokens", f"{m['peak_rss_bytes'] / mb:.0f} MB", "", f"limit {limit:.0f} MB")
        )
    lines = ["| measurement | radixgate local | baseline | ratio (floor) |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c_} | {e} |" for a, b, c_, e in rows]
    return "\n".join(lines)
