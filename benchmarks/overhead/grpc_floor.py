"""What `grpc.aio` alone costs: a server whose `ModelInfer` answers at once with an empty response.

The same server library, loop (uvloop) and generated messages as the gateway's gRPC front door, and
nothing else, so its CPU per request is the floor under any Python front door built on `grpc.aio`.

    python -m benchmarks.overhead.grpc_floor --port 9194
"""

from __future__ import annotations

import argparse
from typing import Any

import grpc
import uvloop

from proxy.grpc.protocol import grpc_service_pb2 as pb
from proxy.grpc.tracing import SERVICE


async def _live(request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
    return pb.ServerLiveResponse(live=True)


async def _infer(request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
    return pb.ModelInferResponse(model_name=request.model_name, id=request.id)


async def serve(port: int) -> None:
    server = grpc.aio.server()
    handlers = {
        "ServerLive": grpc.unary_unary_rpc_method_handler(
            _live, pb.ServerLiveRequest.FromString, pb.ServerLiveResponse.SerializeToString
        ),
        "ModelInfer": grpc.unary_unary_rpc_method_handler(
            _infer, pb.ModelInferRequest.FromString, pb.ModelInferResponse.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    uvloop.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
