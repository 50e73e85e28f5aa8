"""What reading a stream chunk costs now that the time to first token waits for the first chunk
that carries output: `probe_response` decodes each choice's `delta` too (content, reasoning, tool
calls). Measured side by side with a probe of the old shape (no delta) on the same chunks.

    python -m benchmarks.observability.probe_cost [--rounds 7] [--number 200000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

import msgspec

from adapters.schema import Usage, probe_response


class _OldChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    finish_reason: str | None = None


class _OldProbe(msgspec.Struct, kw_only=True):
    id: str | None = None
    model: str | None = None
    choices: list[_OldChoice] = msgspec.field(default_factory=list)
    usage: Usage | None = None


CHUNK = json.dumps(
    {
        "id": "chatcmpl-123",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [{"index": 0, "delta": {"content": " the"}, "logprobs": None, "finish_reason": None}],
    }
).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()
    old = msgspec.json.Decoder(_OldProbe)

    def new_probe() -> None:
        # What `UpstreamStream` does per chunk until the first token (and after it with a meter).
        for choice in probe_response(CHUNK).choices:
            if choice.carries_token:
                break

    def decode_only() -> None:  # after the first token, without a meter: the wider decode alone
        probe_response(CHUNK)

    def old_probe() -> None:
        old.decode(CHUNK)

    runs = {"old": old_probe, "looking": new_probe, "after_first_token": decode_only}
    per_call: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):  # alternate, so drift hits all alike
        for name, run in runs.items():
            per_call[name].append(timeit.timeit(run, number=args.number) / args.number * 1e9)
    ns = {name: statistics.median(values) for name, values in per_call.items()}
    report = {"chunk_bytes": len(CHUNK), **{f"{name}_ns": round(value, 1) for name, value in ns.items()}}
    report |= {
        f"{name}_added_ns": round(ns[name] - ns["old"], 1) for name in ("looking", "after_first_token")
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
