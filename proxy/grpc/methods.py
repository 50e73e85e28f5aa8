"""`inference.GRPCInferenceService`'s method table, on grpcio's public API.

grpcio-tools would generate a `_pb2_grpc` module for this; it is not used, because that module
imports grpc's private `_utilities` for a version check and its base servicer raises for every RPC
a subclass leaves out. This table names the RPCs the gateway serves (any other answers
`UNIMPLEMENTED`), with the messages' own (de)serializers from `grpc_service_pb2`.
"""

from __future__ import annotations

from typing import Any, Final

import grpc
from google.protobuf.message import Message

from proxy.grpc.protocol import grpc_service_pb2 as pb

SERVICE_NAME: Final = "inference.GRPCInferenceService"

_UNARY: Final[dict[str, tuple[type[Message], type[Message]]]] = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
}
"""Each unary RPC's request and response message."""


def inference_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """The service's handlers over `servicer`, whose methods are named as the RPCs."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        for name, (request, response) in _UNARY.items()
    }
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        servicer.ModelStreamInfer,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelStreamInferResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def unary_call(channel: Any, name: str) -> Any:
    """A client callable for the unary RPC `name` on `channel` (a `grpc.aio` or plain channel)."""
    request, response = _UNARY[name]
    return channel.unary_unary(
        f"/{SERVICE_NAME}/{name}",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )
