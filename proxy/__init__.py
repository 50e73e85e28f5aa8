"""radixgate: an OpenAI-compatible gateway for self-hosted LLM engines."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("radixgate")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
