"""Finding a model's tokenizer without configuration, from the worker that serves it.

When `routing.tokenizers` names nothing for a model, the first worker seen up that serves it is
asked, in this order (the first that works wins):

    tokenizer.json   the path the engine says it loaded its tokenizer from (SGLang `/server_info`
                     `tokenizer_path`, vLLM `/v1/models` `root`), when this host can read it:
                     exact token ids, encoded locally
    engine           the engine's own `POST /tokenize` (SGLang, vLLM): exact, one round trip per
                     new chat message (messages are cached)
    bytes            UTF-8 bytes, converted to tokens with the bytes per token learned from the
                     engine's reported `prompt_tokens` (`Worker.learn_bytes_per_token`)

`GET /admin/workers` shows which kind each model got and where it came from.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from adapters.engine_metrics import NamesTokenizer, Tokenizes
from proxy.routing.tokenizing import HFTokenizer, load_chat_template, load_tokenizer
from proxy.routing.worker import Worker

logger = logging.getLogger("radixgate.routing.discovery")

PROBE_TEXT = "radixgate tokenizer probe"


@dataclass(frozen=True, slots=True)
class Discovered:
    """What a worker offered for tokenizing a model."""

    kind: str
    """"tokenizer.json", "engine" or "bytes"."""
    source: str
    """Where it came from: a path, `WORKER/tokenize`, or "utf-8"."""
    tokenizer: HFTokenizer | None = None
    template: str | None = None
    """The chat template next to a discovered tokenizer.json, if any."""


BYTES = Discovered(kind="bytes", source="utf-8")


async def discover_tokenizer(worker: Worker, timeout_s: float) -> Discovered:
    """The best tokenizer `worker` makes available (see the module docstring); never raises."""
    engine = worker.engine
    if isinstance(engine, NamesTokenizer):
        try:
            async with asyncio.timeout(timeout_s):
                path = await engine.tokenizer_path()
        except Exception as exc:  # the engine need not say: try the next way
            logger.debug("tokenizer path of %s unknown: %r", worker.id, exc)
            path = None
        if path:
            found = await asyncio.to_thread(_local_tokenizer, path)
            if found is not None:
                return found
    if isinstance(engine, Tokenizes):
        try:
            async with asyncio.timeout(timeout_s):
                ids = await engine.tokenize(PROBE_TEXT)
            if ids:
                return Discovered(kind="engine", source=f"{worker.id}/tokenize")
        except Exception as exc:  # no /tokenize (an OpenAI-compatible server): bytes it is
            logger.debug("tokenize on %s unavailable: %r", worker.id, exc)
    return BYTES


def _local_tokenizer(path: str) -> Discovered | None:
    """A tokenizer.json at `path` (or in the directory `path`), when this host can read it."""
    candidate = Path(path)
    if not (candidate.is_file() or (candidate / "tokenizer.json").is_file()):
        return None
    try:
        tokenizer = load_tokenizer(path)
        template = load_chat_template(path)
    except (OSError, ValueError, RuntimeError) as exc:  # an unreadable file: the next way
        logger.debug("tokenizer at %s unusable: %r", path, exc)
        return None
    if not isinstance(tokenizer, HFTokenizer):
        return None
    return Discovered(kind=tokenizer.kind, source=tokenizer.source, tokenizer=tokenizer, template=template)
