"""Routing over many engine workers: the `proxy.router.Router` the request path uses.

    config        WorkerSpec, RoutingSettings and their knobs (DEFAULT_* next to each)
    pool          WorkerPool (the Router); run-time add, remove and drain; panic mode
    lease         PoolLease: one attempt, and what its outcome teaches the router
    worker        one worker's load, health, breaker and approximate prefix tree
    policies      round_robin, random, power_of_two, least_load, session
    cache_aware   the default policy: its cost function within a bounded load
    prompts       request -> salted token ids (tokenizing.py, gguf_vocab.py: where they come from;
                  discovery.py: a model's tokenizer found from its workers)
    kv_events     a worker's KV-event feed over its data-parallel ranks (kv_stream: one rank's
                  stream; kv_wire: vLLM/SGLang wire format; kv_index: its blocks)
    health        active health checks; breaker: per-worker circuit breaker
    observe       Prometheus series and a span per decision; admin: /admin/workers
    registry      policies by name, adapters by worker kind; from_settings: Settings -> WorkerPool
    launch        worker processes: `--workers N`, `--launch-sglang`

See docs/routing.md.
"""
