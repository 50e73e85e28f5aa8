"""The engine's glibc tuning (`loader.tune_allocator`): a step's activations come from the heap and
stay mapped between steps, instead of being unmapped as they are freed and faulted in again.

Whether a freed activation ends at the heap's top (where glibc trims) depends on the whole process's
layout, so no small test reproduces the faults reliably (measured: `loader.TRIM_THRESHOLD_BYTES`);
what is tested is that both thresholds are set, and in the order glibc's rules need."""

from __future__ import annotations

import pytest

from adapters.local import loader


class _RecordingLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", (param, value)))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", (pad,)))
        return 1


def test_both_thresholds_are_fixed_and_the_heap_trimmed(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = _RecordingLibc()
    monkeypatch.setattr(loader, "_libc", lambda: libc)
    loader.tune_allocator()
    assert libc.calls == [
        ("mallopt", (-3, loader.MMAP_THRESHOLD_BYTES)),  # M_MMAP_THRESHOLD
        ("mallopt", (-1, loader.TRIM_THRESHOLD_BYTES)),  # M_TRIM_THRESHOLD
        ("malloc_trim", (0,)),
    ]
    assert loader.TRIM_THRESHOLD_BYTES >= loader.MMAP_THRESHOLD_BYTES  # a kept top above any heap block


def test_without_glibc_the_tuning_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "_libc", lambda: None)
    loader.tune_allocator()
    loader.release_heap()


@pytest.mark.skipif(loader._libc() is None, reason="glibc's own mallopt; the no-op path is tested above")
def test_glibc_accepts_both_settings() -> None:
    libc = loader._libc()
    assert libc is not None
    assert libc.mallopt(-3, loader.MMAP_THRESHOLD_BYTES) == 1  # mallopt returns 1 on success
    assert libc.mallopt(-1, loader.TRIM_THRESHOLD_BYTES) == 1
