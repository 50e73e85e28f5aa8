"""The gRPC front door: the KServe v2 inference protocol (`inference.GRPCInferenceService`, as
Triton serves it) over the same request pipeline as the HTTP routes.

    protocol/   the protocol's messages (`grpc_service.proto` and its generated modules; `make grpc-stubs`)
    tensors     text generation tensors as Triton's vLLM backend names them <-> an OpenAI completions body
    responder   the pipeline's `Responder` for ModelInfer and ModelStreamInfer
    status      the one mapping of an error reply's HTTP status to a gRPC status code
    tracing     one SERVER span per inference request, in the caller's trace (`traceparent` metadata)
    servicer    the RPCs: liveness, readiness, metadata, ModelInfer, ModelStreamInfer (one SERVER span each)
    server      the `grpc.aio` server on the gateway's loop, with health checking and reflection

The app imports `server` only when `[server] grpc_port` is set: the generated messages register the
protocol's names (`inference.*`) in protobuf's default pool, where a client library's own copy
(tritonclient's) may not live beside them, so a process that does not serve gRPC never loads them.
"""
