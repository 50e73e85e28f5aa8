"""`[responses]`: how long stored responses are kept."""

from __future__ import annotations

from typing import Annotated

import msgspec

DEFAULT_TTL_S = 30 * 24 * 3600.0
"""OpenAI keeps a stored response 30 days."""
RESPONSES_FILE = "responses.sqlite3"


class ResponsesSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Stored responses (`store: true` on `POST /v1/responses`, the default)."""

    ttl_s: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_TTL_S
    """Seconds a stored response can be read (`GET /v1/responses/{id}`) and continued
    (`previous_response_id`); then it is gone."""
    path: str | None = None
    """The SQLite file of stored responses; default `responses.sqlite3` in `cache.dir`, else memory
    only (gone with the process)."""
