"""`ContextCacheConfig`: the seed's presets, the TOML sections, their mapping onto the store, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.local.config import LocalEngineConfig
from cachelayer.memory import ENTRY_OVERHEAD_BYTES
from cachelayer.tiers import TieredStore
from proxy.cache.config import (
    KV_SUBDIR,
    RESPONSES_SUBDIR,
    ContextCacheConfig,
    cache_config,
    local_engine_config,
)
from proxy.cache.settings import CacheSettings, KvCacheSettings
from proxy.cli import _parser, _settings
from proxy.config import SettingsError, load_settings
from proxy.settings import Settings

SEED_TOML = """
[kv_cache]
l1_capacity = 5000
l2_capacity = 50000
max_memory_bytes = 1000000000
eviction_policy = "Adaptive"
ttl_seconds = 3600

[speculative]
beam_width = 6
temperature = 0.8
top_k = 40
top_p = 0.9

[sliding_window]
window_size = 512
window_overlap = 64
use_flash_attention = true

[monitoring]
enabled = true
collection_interval_seconds = 30
detailed_profiling = true
"""


def test_production_preset_carries_the_seed_numbers() -> None:
    config = ContextCacheConfig.production_optimized()
    kv = config.kv_cache
    assert (kv.l1_capacity, kv.l2_capacity) == (10_000, 100_000)
    assert (kv.max_memory_bytes, kv.persistent_bytes) == (8_000_000_000, 10_000_000_000)
    assert config.speculative.beam_width == 8
    assert config.sliding_window.window_size == 1024
    assert config.monitoring.enabled and config.monitoring.detailed_profiling


def test_development_preset_carries_the_seed_numbers() -> None:
    config = ContextCacheConfig.development()
    kv = config.kv_cache
    assert (kv.l1_capacity, kv.l2_capacity, kv.max_memory_bytes) == (1_000, 5_000, 500_000_000)
    assert config.speculative.beam_width == 2
    assert config.sliding_window.window_size == 256
    # "Persistence disabled": no disk tier unless a directory is given.
    assert config.response_store(CacheSettings()).l3 is None


def test_memory_budget_is_split_by_capacity_and_never_exceeded() -> None:
    kv = ContextCacheConfig.production_optimized().kv_cache
    store = kv.store_config(None, write_policy="write_through")
    assert store.l1 is not None and store.l2 is not None
    assert store.l1.capacity_bytes + store.l2.capacity_bytes == 8_000_000_000
    assert store.l1.capacity_bytes == 8_000_000_000 * 10_000 // 110_000
    assert (store.l1.max_entries, store.l2.max_entries) == (10_000, 100_000)
    assert store.l1.policy == store.l2.policy == "adaptive"
    assert store.default_ttl_s == 3600


def test_entry_capacities_hold_in_a_live_store() -> None:
    kv = ContextCacheConfig.development().kv_cache
    small = type(kv)(
        l1_capacity=2,
        l2_capacity=3,
        max_memory_bytes=1 << 20,
        persistent_bytes=1 << 20,
        eviction_policy="lru",
        ttl_seconds=None,
    )
    store = TieredStore.from_config(small.store_config(None, write_policy="write_back"))
    for number in range(10):
        store.put(number.to_bytes(32, "little"), b"v" * 10)
    l1, l2 = store.stats().tiers
    assert (l1.entries, l2.entries) == (2, 3)
    assert l1.bytes == 2 * (32 + 10 + ENTRY_OVERHEAD_BYTES)


def test_cache_dir_puts_l3_under_responses(tmp_path: Path) -> None:
    config = ContextCacheConfig.preset("production")
    store = config.response_store(CacheSettings(dir=tmp_path))
    assert store.l3 is not None
    assert store.l3.directory == tmp_path / RESPONSES_SUBDIR
    assert store.l3.capacity_bytes == 10_000_000_000


def test_seed_toml_sections_load_and_override_the_preset(tmp_path: Path) -> None:
    path = tmp_path / "radixgate.toml"
    path.write_text('[cache]\npreset = "production"\n' + SEED_TOML)
    config = cache_config(load_settings(str(path), environ={}))
    kv = config.kv_cache
    assert (kv.l1_capacity, kv.l2_capacity, kv.max_memory_bytes) == (5_000, 50_000, 1_000_000_000)
    assert kv.eviction_policy == "adaptive"
    assert kv.persistent_bytes == 10_000_000_000  # not in the file: the production preset's
    assert config.speculative.beam_width == 6
    assert (config.sliding_window.window_size, config.sliding_window.window_overlap) == (512, 64)
    assert config.monitoring.collection_interval_seconds == 30


def test_overrides_apply_key_by_key_over_the_default_preset() -> None:
    settings = Settings(kv_cache=KvCacheSettings(l1_capacity=7, eviction_policy="LFU"))
    kv = cache_config(settings).kv_cache
    assert (kv.l1_capacity, kv.l2_capacity, kv.eviction_policy) == (7, 5_000, "lfu")


@pytest.mark.parametrize(
    ("toml", "line"),
    [
        ('[kv_cache]\neviction_policy = "random"', "invalid setting kv_cache.eviction_policy"),
        ("[kv_cache]\nl1_capacity = 0", "invalid setting kv_cache.l1_capacity"),
        ("[kv_cache]\nttl_seconds = -1", "invalid setting kv_cache.ttl_seconds"),
        ("[kv_cache]\nl3_capacity = 10", "invalid setting kv_cache.l3_capacity"),
        ("[speculative]\nbeam_width = 40", "invalid setting speculative.beam_width"),
        ("[speculative]\ntop_p = 0", "invalid setting speculative.top_p"),
        ("[sliding_window]\nwindow_size = 32", "invalid setting sliding_window.window_size"),
        ("[sliding_window]\nwindow_overlap = 256", "invalid setting sliding_window.window_overlap"),
        ("[sliding_window]\nsink_tokens = 0", "invalid setting sliding_window.sink_tokens"),
        (
            "[sliding_window]\nuse_flash_attention = false",
            "invalid setting sliding_window.use_flash_attention",
        ),
        ("[local_engine]\nwindow_size = 512", "invalid setting local_engine.window_size"),
        (
            "[monitoring]\ncollection_interval_seconds = 0",
            "invalid setting monitoring.collection_interval_seconds",
        ),
        ('[cache]\npreset = "fast"', "invalid setting cache.preset"),
        ('[cache]\nwrite_policy = "sometimes"', "invalid setting cache.write_policy"),
        ('[cache]\nadmission = "sometimes"', "invalid setting cache.admission"),
        ("[cache]\nadmission_min_hit_rate = 2", "invalid setting cache.admission_min_hit_rate"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, toml: str, line: str) -> None:
    path = tmp_path / "radixgate.toml"
    path.write_text(toml)
    with pytest.raises(SettingsError) as caught:
        load_settings(str(path), environ={})
    assert str(caught.value).startswith(line)
    assert str(path) in str(caught.value)


def test_cache_dir_flag_sets_cache_dir(tmp_path: Path) -> None:
    args = _parser().parse_args(["serve", "--upstream", "http://127.0.0.1:9", "--cache-dir", str(tmp_path)])
    settings = _settings(args)
    assert settings.cache.dir == tmp_path


def test_cache_dir_from_the_environment() -> None:
    settings = load_settings(
        environ={"RADIXGATE_CACHE__DIR": "/tmp/rg-cache", "RADIXGATE_CACHE__PRESET": "production"}
    )
    assert settings.cache.dir == Path("/tmp/rg-cache")
    assert settings.cache.preset == "production"


def test_cache_dir_turns_on_kv_offload_under_kv(tmp_path: Path) -> None:
    plain = local_engine_config(Settings())
    assert not plain.kv_offload and plain.kv_offload_dir is None
    with_dir = local_engine_config(Settings(cache=CacheSettings(dir=tmp_path)))
    assert with_dir.kv_offload and with_dir.kv_offload_dir == tmp_path / KV_SUBDIR
    own = LocalEngineConfig(kv_offload=True, kv_offload_dir=tmp_path / "elsewhere")
    explicit = local_engine_config(Settings(local_engine=own, cache=CacheSettings(dir=tmp_path)))
    assert explicit.kv_offload_dir == tmp_path / "elsewhere"


def test_sliding_window_settings_reach_the_embedded_engine(tmp_path: Path) -> None:
    path = tmp_path / "radixgate.toml"
    path.write_text(
        "[sliding_window]\nenabled = true\nwindow_size = 512\nwindow_overlap = 32\nsink_tokens = 8\n"
    )
    engine = local_engine_config(load_settings(str(path), environ={}))
    assert (engine.sliding_window, engine.window_size, engine.window_overlap) == (True, 512, 32)
    assert engine.window_sink_tokens == 8
    default = local_engine_config(Settings())  # the development preset's window, off by default
    assert (default.sliding_window, default.window_size, default.window_sink_tokens) == (False, 256, 4)
