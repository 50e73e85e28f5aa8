"""`OPTIONS` for paths served by several handlers, with an `Allow` that names all their methods.

Litestar 2's automatic OPTIONS handler names only the methods of the first handler registered at a
path (litestar-org/litestar#4169, fixed in Litestar 3), so a path with a GET and a POST handler
answered `Allow: GET, OPTIONS`. An explicit handler, given the path's methods, replaces it.
"""

from __future__ import annotations

from litestar import Response, route
from litestar.handlers import HTTPRouteHandler


def options_handler(path: str, methods: tuple[str, ...]) -> HTTPRouteHandler:
    """`OPTIONS path`: 204 with `Allow` listing `methods` and OPTIONS."""
    allow = ", ".join(sorted({*methods, "OPTIONS"}))

    @route(
        path, http_method=["OPTIONS"], sync_to_thread=False, include_in_schema=False, name=f"options {path}"
    )
    def options() -> Response[None]:
        return Response(None, status_code=204, headers={"allow": allow})

    return options
