"""Pure data structures of the cache layer: no proxy, adapters, Litestar, httpx or torch here.

- ``radix``: token-level radix tree (prefix match, insert, locks, leaf eviction, on-evict hook)
- ``token_bytes``: token ids packed as uint32 bytes and their fast common-prefix search
- ``keys``: the canonical chained SHA-256 keys over token blocks, and keys for canonical bytes
- ``tiers``: the tiered byte store (``TieredStore``, ``StoreConfig``) over the tiers below
- ``memory`` / ``disk`` / ``remote``: the L1-L2 memory, L3 disk and Redis tiers
- ``policies``: eviction policies by name (lru, lfu, fifo, adaptive)
- ``responses``: the exact-match response cache (deterministic requests only)
- ``tier``: the ``Tier`` protocol and ``Entry``; ``stats``: counters and typed snapshots
"""
