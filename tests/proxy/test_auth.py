"""API keys to tenants: hashed keys, 401s, the anonymous tenant, per-tenant cache salts."""

from __future__ import annotations

import pytest

from proxy.auth import Authenticator, cache_salt, hash_key
from proxy.errors import ApiError
from proxy.settings import ApiKeySettings, AuthSettings


def _auth(secret: str = "s3cret") -> Authenticator:
    keys = [
        ApiKeySettings(tenant="acme", sha256=hash_key("sk-acme-1")),
        ApiKeySettings(tenant="acme", sha256=hash_key("sk-acme-2")),
        ApiKeySettings(tenant="globex", sha256=hash_key("sk-globex").upper()),
    ]
    return Authenticator(AuthSettings(api_keys=keys, cache_salt_secret=secret))


def test_hash_key_is_sha256_hex() -> None:
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_keys_map_to_their_tenant() -> None:
    auth = _auth()
    assert auth.authenticate(b"Bearer sk-acme-1").id == "acme"
    assert auth.authenticate(b"bearer sk-acme-2").id == "acme"
    assert auth.authenticate(b"Bearer sk-globex").id == "globex"


@pytest.mark.parametrize(
    "header", [None, b"", b"Bearer ", b"Basic c2stYWNtZS0x", b"Bearer sk-wrong", b"sk-acme-1"]
)
def test_missing_or_wrong_key_is_401(header: bytes | None) -> None:
    with pytest.raises(ApiError) as caught:
        _auth().authenticate(header)
    assert caught.value.status == 401
    assert caught.value.detail.code == "invalid_api_key"


def test_no_keys_means_one_anonymous_tenant() -> None:
    auth = Authenticator(AuthSettings())
    assert not auth.required
    assert auth.authenticate(None).id == "anonymous"
    assert auth.authenticate(b"Bearer anything").id == "anonymous"


def test_cache_salts_differ_by_tenant_and_secret() -> None:
    auth = _auth()
    acme = auth.authenticate(b"Bearer sk-acme-1").cache_salt
    assert acme == auth.authenticate(b"Bearer sk-acme-2").cache_salt
    assert acme != auth.authenticate(b"Bearer sk-globex").cache_salt
    assert acme != _auth(secret="other").authenticate(b"Bearer sk-acme-1").cache_salt
    assert acme == cache_salt("s3cret", "acme")
