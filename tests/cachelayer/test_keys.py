"""Canonical keys: pinned vectors, the documented byte layout, and what must change a key."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachelayer.keys import KeySeed, block_hashes, bytes_key, chain_hashes, seed_hash

SEED = KeySeed("SmolLM2-135M-Instruct", "tok-sha256:abc", "tenant-a")


def test_pinned_vectors() -> None:
    # Computed once from this implementation; any change here breaks every persisted L3/Redis entry.
    assert seed_hash(SEED, 4).hex() == "32ed227968be61290fa06837b5d1c40666834f4452fdc6d235ae5fd1b2035499"
    assert [h.hex() for h in block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], block_size=4, seed=SEED)] == [
        "6edd68c0916bf0c92de232897285d06dc60d36952f123087fcf1a4ece40128cf",
        "95da182e522cc692726685a7bed7a864b672ccbaac8ad7338b4f74ff8321408c",
    ]
    edge = block_hashes([0, 4294967295, 151643], block_size=3, seed=KeySeed("m", "", ""))
    assert edge[0].hex() == "74c3133eeb068ac3929cdcce429ccdaa928b44ec187d1aa8f66b02419d111d4a"
    response = bytes_key(b'{"model":"m"}', seed=SEED, namespace="response")
    assert response.hex() == "40524e7d30622571fc182b7e420ec8e8defd927c1c40e42c403b494889607c3c"


def test_layout_matches_the_module_docstring() -> None:
    def lp(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<I", len(data)) + data

    fields = lp(SEED.model_id) + lp(SEED.tokenizer_hash) + lp(SEED.tenant_salt)
    root = hashlib.sha256(b"radixgate/kv-seed/v1" + fields + struct.pack("<I", 2)).digest()
    first = hashlib.sha256(root + struct.pack("<2I", 7, 70000)).digest()
    second = hashlib.sha256(first + struct.pack("<2I", 1, 2)).digest()
    assert block_hashes([7, 70000, 1, 2, 3], block_size=2, seed=SEED) == [first, second]


@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=40), size=st.integers(1, 8))
def test_chain_can_resume_from_any_block(tokens: list[int], size: int) -> None:
    full = block_hashes(tokens, block_size=size, seed=SEED)
    assert len(full) == len(tokens) // size
    for cut in range(len(full)):
        resumed = chain_hashes(full[cut], tokens[(cut + 1) * size :], block_size=size)
        assert full[cut + 1 :] == resumed


@given(a=st.lists(st.integers(0, 50), min_size=4, max_size=12), b=st.lists(st.integers(0, 50), max_size=12))
def test_equal_keys_exactly_for_equal_prefixes(a: list[int], b: list[int]) -> None:
    ha, hb = block_hashes(a, block_size=4, seed=SEED), block_hashes(b, block_size=4, seed=SEED)
    for i in range(min(len(ha), len(hb))):
        assert (ha[i] == hb[i]) == (a[: (i + 1) * 4] == b[: (i + 1) * 4])


@pytest.mark.parametrize(
    "other",
    [
        KeySeed("other-model", "tok-sha256:abc", "tenant-a"),
        KeySeed("SmolLM2-135M-Instruct", "x", "tenant-a"),
        KeySeed("SmolLM2-135M-Instruct", "tok-sha256:abc", "tenant-b"),
    ],
)
def test_model_tokenizer_and_tenant_each_change_every_key(other: KeySeed) -> None:
    tokens = list(range(8))
    mine, theirs = (
        block_hashes(tokens, block_size=4, seed=SEED),
        block_hashes(tokens, block_size=4, seed=other),
    )
    assert not set(mine) & set(theirs)
    assert bytes_key(b"x", seed=SEED, namespace="r") != bytes_key(b"x", seed=other, namespace="r")


def test_block_size_and_namespace_change_keys() -> None:
    tokens = list(range(8))
    assert (
        block_hashes(tokens, block_size=4, seed=SEED)[1] != block_hashes(tokens, block_size=8, seed=SEED)[0]
    )
    assert bytes_key(b"x", seed=SEED, namespace="a") != bytes_key(b"x", seed=SEED, namespace="b")


def test_bad_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="token ids"):
        block_hashes([-1], block_size=1, seed=SEED)
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1], block_size=0, seed=SEED)
    with pytest.raises(ValueError, match="digest"):
        chain_hashes(b"short", [1], block_size=1)
