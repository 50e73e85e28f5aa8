"""Engine adapters: one module per engine protocol, all behind `adapters.base.Engine`."""

from adapters.base import Completion, Engine, EngineRequest
from adapters.errors import (
    EngineError,
    EngineOverloaded,
    InBandError,
    UpstreamStatusError,
    UpstreamTimeout,
    UpstreamUnreachable,
)

__all__ = [
    "Completion",
    "Engine",
    "EngineError",
    "EngineOverloaded",
    "EngineRequest",
    "InBandError",
    "UpstreamStatusError",
    "UpstreamTimeout",
    "UpstreamUnreachable",
]
