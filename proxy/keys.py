"""API keys created at run time (`POST /admin/keys`), kept hashed in the ledger's SQLite database.

A key is shown once, when it is created; the database holds its SHA-256 only, so a copy of the file
gives no usable key. A revoked key stops working at once in this process. Keys configured in
`[[auth.api_keys]]` keep working beside them. With no ledger file (no `auth.ledger_path`, no
`cache.dir`) the keys live in memory and end with the process.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

KEY_PREFIX = "rg-"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, sha256 BLOB NOT NULL UNIQUE,
    admin INTEGER NOT NULL, created_at REAL NOT NULL, revoked_at REAL
)
"""


@dataclass(slots=True, frozen=True)
class StoredKey:
    """One run-time key, without the key itself."""

    id: str
    tenant: str
    admin: bool
    created_at: float


class KeyStore:
    """Run-time keys by digest, backed by a SQLite table."""

    def __init__(self, path: Path | None) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:" if path is None else str(path), check_same_thread=False)
        self._db.execute(_SCHEMA)
        self._by_digest: dict[bytes, StoredKey] = {}
        rows = self._db.execute(
            "SELECT id, tenant, sha256, admin, created_at FROM api_keys WHERE revoked_at IS NULL"
        )
        for key_id, tenant, digest, admin, created in rows:
            self._by_digest[bytes(digest)] = StoredKey(key_id, tenant, bool(admin), created)

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    def find(self, digest: bytes) -> StoredKey | None:
        """The live key whose SHA-256 is `digest`."""
        return self._by_digest.get(digest)

    def create(self, tenant: str, admin: bool) -> tuple[StoredKey, str]:
        """A new key for `tenant`: its record, and the key itself (shown once, never stored)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = hashlib.sha256(key.encode()).digest()
        stored = StoredKey("key_" + secrets.token_hex(8), tenant, admin, time.time())
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
                (stored.id, tenant, digest, int(admin), stored.created_at),
            )
        self._by_digest[digest] = stored
        return stored, key

    def revoke(self, key_id: str) -> bool:
        """Stop a key from working; False when no live key has that id."""
        for digest, stored in list(self._by_digest.items()):
            if stored.id == key_id:
                with self._lock, self._db:
                    self._db.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?", (time.time(), key_id))
                del self._by_digest[digest]
                return True
        return False

    def live(self) -> list[StoredKey]:
        """Every key that works now, oldest first."""
        return sorted(self._by_digest.values(), key=lambda stored: stored.created_at)

    def close(self) -> None:
        self._db.close()
