"""The `[telemetry]` section of the settings tree.

Exporters are chosen by the standard `OTEL_*` environment variables (see `proxy.telemetry.providers`);
these settings only say whether radixgate instruments itself and under which service name.
"""

from __future__ import annotations

import msgspec

DEFAULT_SERVICE_NAME = "radixgate"


class TelemetrySettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """OpenTelemetry traces and GenAI metrics. Prometheus `/metrics` is served either way."""

    enabled: bool = True
    """Create OpenTelemetry spans and GenAI metrics. When off, incoming `traceparent` still reaches
    the upstream unchanged and Prometheus metrics are still counted."""
    service_name: str = DEFAULT_SERVICE_NAME
    """`service.name` of the resource; `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` override it."""
