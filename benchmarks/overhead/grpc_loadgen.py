"""Open-loop gRPC load generator: unary `ModelInfer` calls at a fixed rate on one HTTP/2 channel.

Request i is due at `start + i / rate` whatever happened to earlier ones (no coordinated omission);
latency runs from the call's start to its response. The request is the tensors of Triton's vLLM
backend for the same text completion `loadgen.py --path /v1/completions` sends. Prints one JSON
summary in `loadgen.py`'s shape.

    python -m benchmarks.overhead.grpc_loadgen --port 9183 --rate 300 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import time

import grpc

from benchmarks.overhead.loadgen import ANSWER_TIMEOUT_S, DEFAULT_MODEL, PROMPT, percentiles
from proxy.grpc.methods import unary_call
from proxy.grpc.protocol import grpc_service_pb2 as pb


def infer_request(model: str) -> pb.ModelInferRequest:
    def raw_bytes(value: bytes) -> bytes:
        return struct.pack("<I", len(value)) + value

    tensor = pb.ModelInferRequest.InferInputTensor
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[
            tensor(name="text_input", datatype="BYTES", shape=[1]),
            tensor(name="sampling_parameters", datatype="BYTES", shape=[1]),
            tensor(name="exclude_input_in_output", datatype="BOOL", shape=[1]),
        ],
        raw_input_contents=[raw_bytes(PROMPT.encode()), raw_bytes(b'{"max_tokens":16}'), b"\x01"],
    )


async def run(args: argparse.Namespace) -> dict[str, object]:
    request = infer_request(args.model)
    metadata = (("authorization", "Bearer bench"),)
    latencies: list[float] = []
    lags: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(f"{args.host}:{args.port}") as channel:
        server_live, model_infer = unary_call(channel, "ServerLive"), unary_call(channel, "ModelInfer")
        await server_live(pb.ServerLiveRequest())  # connected before the clock starts

        async def call(due: float, measured: bool) -> None:
            nonlocal errors
            sent = time.perf_counter()
            try:
                await model_infer(request, metadata=metadata, timeout=ANSWER_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                errors += measured
                return
            if measured:
                latencies.append(time.perf_counter() - sent)
                lags.append(sent - due)

        total = int(args.rate * args.duration)
        interval = 1.0 / args.rate
        started = time.perf_counter() + 0.01
        tasks = []
        for i in range(total):
            due = started + i * interval
            now = time.perf_counter()
            if due > now:
                await asyncio.sleep(due - now)
            tasks.append(asyncio.create_task(call(due, due >= started + args.warmup)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    return {
        "requests": total,
        "measured": len(latencies) + errors,
        "errors": errors,
        "throughput_rps": total / elapsed,
        "latency_ms": percentiles(latencies),
        "ttfc_ms": {},
        "send_lag_ms": percentiles(lags),
        "mode": "open",
        "rate": args.rate,
        "duration_s": args.duration,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rate", type=float, default=300.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds left out of percentiles")
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
