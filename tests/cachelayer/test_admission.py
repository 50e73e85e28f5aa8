"""The response cache's admission gate: which missed answers get stored."""

from __future__ import annotations

import pytest

from cachelayer.admission import AdmissionGate


def keys(count: int, tag: str = "k") -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(count)]


def test_always_admits_every_miss() -> None:
    gate = AdmissionGate("always", window_lookups=4)
    for _ in range(10):
        gate.observe(False)
    assert all(gate.admit(key) for key in keys(10)) and not gate.selective


def test_second_sighting_admits_a_body_from_its_second_sighting_on() -> None:
    gate = AdmissionGate("second_sighting")
    sightings = [gate.admit(body) for body in (b"a", b"b", b"a", b"a", b"b")]
    assert sightings == [False, False, True, True, True]


def test_the_doorkeeper_forgets_everything_when_full() -> None:
    gate = AdmissionGate("second_sighting", doorkeeper_keys=3)
    assert not any(gate.admit(key) for key in keys(3))
    assert not gate.admit(b"x")  # the fourth tag starts a new doorkeeper
    assert not gate.admit(b"k0")  # forgotten
    assert gate.admit(b"x")


def test_adaptive_turns_selective_after_a_window_without_hits_and_back_after_one_with_hits() -> None:
    gate = AdmissionGate("adaptive", window_lookups=100, min_hit_rate=0.05)
    assert gate.admit(b"first") and not gate.selective  # a fresh gateway stores everything
    for _ in range(100):
        gate.observe(False)
    assert gate.selective
    assert [gate.admit(b"q"), gate.admit(b"q"), gate.admit(b"q")] == [False, True, True]
    for number in range(100):
        gate.observe(number < 5)  # 5% hits: the rate is reached
    assert not gate.selective and gate.admit(b"new")


def test_adaptive_stays_selective_below_the_rate() -> None:
    gate = AdmissionGate("adaptive", window_lookups=100, min_hit_rate=0.05)
    for _ in range(3):
        for number in range(100):
            gate.observe(number < 4)
        assert gate.selective


@pytest.mark.parametrize(
    "kwargs",
    [{"policy": "sometimes"}, {"window_lookups": 0}, {"doorkeeper_keys": 0}, {"min_hit_rate": 1.5}],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        AdmissionGate(**kwargs)  # type: ignore[arg-type]
