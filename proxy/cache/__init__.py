"""The gateway's cache: settings and presets, the response-cache step of the request path, the cached
endpoints, cache management, stats and Prometheus series. The data structures live in `cachelayer`.

- ``settings``: the TOML sections `[cache]`, `[kv_cache]`, `[speculative]`, `[sliding_window]`,
  `[monitoring]`
- ``config``: `ContextCacheConfig`, its presets and the mapping onto the tiered store
- ``layer``: `CacheLayer`, the cache of one app (store, counters, routes, metrics)
- ``step``: `ResponseCacheStep`, the response-cache step of the request path
- ``counters``: live counters and trend samples; ``stats``: `GET /v1/cache/stats`; ``metrics``: `/metrics`
- ``cached_routes`` / ``decorate``: `POST /v1/cached/*` and their response extras
- ``admin_routes`` / ``warm``: `GET /v1/cache/stats`, `POST /v1/cache/clear`, `POST /v1/cache/warm`
"""
