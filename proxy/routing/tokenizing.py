"""Turning a request into the token ids the routing trees are keyed by.

The router keys each worker's tree by the token ids of the *chat-templated* prompt, because that is
what the engine's own prefix cache sees. A tokenizer comes from the model's configuration:

    tokenizer.json   a Hugging Face `tokenizers` file (no torch, no transformers)
    gguf             the tokenizer embedded in a GGUF model file (via `tokenizers` as well)
    engine           the engine's own `POST /tokenize` (vLLM, SGLang): exact, one round trip
    bytes            UTF-8 bytes of the rendered prompt: no configuration needed, still prefix-stable

The kind in use is reported in `GET /admin/workers` so an operator can see a byte fallback.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from adapters.schema import ChatCompletionRequest, ChatMessage, CompletionRequest, GenerationRequest

TokenizerKind = Literal["tokenizer.json", "gguf", "engine", "bytes"]

_WIDE_BYTES = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
"""UTF-32 in native order, no byte-order mark: `ByteTokenizer.encode_array`'s widening codec."""

CHAT_START = "<|im_start|>"
CHAT_END = "<|im_end|>"
"""ChatML markers of the default template, used when the model configures no chat template."""


class PromptTokenizer(Protocol):
    """Encodes rendered prompt text into token ids."""

    kind: TokenizerKind
    source: str
    """Where the vocabulary came from (a path, an engine URL, or "utf-8")."""

    async def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens added."""
        ...


@dataclass(slots=True)
class ByteTokenizer:
    """UTF-8 bytes as token ids: approximate, but prefix-stable, which is all the trees need."""

    kind: TokenizerKind = "bytes"
    source: str = "utf-8"

    def encode_now(self, text: str) -> list[int]:
        """Synchronous encode (for callers without an event loop)."""
        return list(text.encode())

    def encode_array(self, text: str) -> array[int]:
        """`encode_now` as the uint32 array the trees take, built in C: decoded as Latin-1, each
        UTF-8 byte is one code point of its own value, which UTF-32 writes as one 4-byte item. For
        a 7.5 KB prompt 9 us, against 95 for `array("I", encode_now(text))`: on a byte-routed model
        with a new prompt per request, that copy was over a third of a routing decision's CPU."""
        ids = array("I")
        ids.frombytes(text.encode().decode("latin-1").encode(_WIDE_BYTES))
        return ids

    def decode_now(self, ids: Sequence[int]) -> str:
        """Inverse of `encode_now`; undecodable bytes become U+FFFD."""
        return bytes(ids).decode(errors="replace")

    async def encode(self, text: str) -> list[int]:
        return self.encode_now(text)


class HFTokenizer:
    """A `tokenizers.Tokenizer` loaded from a tokenizer.json or built from a GGUF file's vocabulary."""

    def __init__(self, tokenizer: Any, kind: TokenizerKind, source: str) -> None:
        self._tokenizer = tokenizer
        self.kind: TokenizerKind = kind
        self.source = source

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        """Load a Hugging Face tokenizer.json (needs the `tokenizers` package, never torch)."""
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "tokenizer.json needs the 'tokenizers' package: pip install tokenizers"
            ) from exc
        return cls(Tokenizer.from_file(str(path)), "tokenizer.json", str(path))

    @classmethod
    def from_gguf(cls, path: str | Path) -> HFTokenizer:
        """Build a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF model file."""
        from proxy.routing.gguf_vocab import tokenizer_from_gguf

        return cls(tokenizer_from_gguf(Path(path)), "gguf", str(path))

    def raw(self) -> Any:
        """The underlying `tokenizers.Tokenizer`."""
        return self._tokenizer

    def encode_now(self, text: str) -> list[int]:
        """Synchronous encode (the simulated engine and benchmarks use it)."""
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, encoded in parallel by `tokenizers` (which releases the GIL)."""
        return [encoding.ids for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def decode_now(self, ids: Sequence[int]) -> str:
        """Text of `ids`."""
        text: str = self._tokenizer.decode(list(ids), skip_special_tokens=False)
        return text

    async def encode(self, text: str) -> list[int]:
        return self.encode_now(text)


class EngineTokenizer:
    """The engine's own `/tokenize` endpoint, through its adapter."""

    def __init__(self, tokenize: Callable[[str], Awaitable[list[int]]], source: str) -> None:
        self._tokenize = tokenize
        self.kind: TokenizerKind = "engine"
        self.source = source

    async def encode(self, text: str) -> list[int]:
        return await self._tokenize(text)


def load_tokenizer(spec: str | None) -> HFTokenizer | ByteTokenizer:
    """A local tokenizer from a model's `tokenizer` setting: a `.gguf` file, a tokenizer.json path or
    a directory holding one; None (or "bytes") gives the UTF-8 byte fallback."""
    if spec is None or spec in ("", "bytes"):
        return ByteTokenizer()
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"tokenizer file not found: {path}")
    if path.suffix == ".gguf":
        return HFTokenizer.from_gguf(path)
    return HFTokenizer.from_file(path)


def load_chat_template(spec: str | None) -> str | None:
    """The Jinja chat template next to a tokenizer.json (its tokenizer_config.json), if any."""
    if spec is None or spec.endswith(".gguf") or spec in ("", "bytes"):
        return None
    path = Path(spec)
    config = (path if path.is_dir() else path.parent) / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    return template if isinstance(template, str) else None


def message_text(message: ChatMessage) -> str:
    """The text of a message's content (text parts joined; other parts carry no prefix tokens)."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


def chatml_segments(messages: Sequence[ChatMessage]) -> list[str]:
    """The default chat template (ChatML) as one string per message, then the assistant's open turn."""
    parts = [f"{CHAT_START}{m.role}\n{message_text(m)}{CHAT_END}\n" for m in messages]
    parts.append(f"{CHAT_START}assistant\n")
    return parts


def render_chatml(messages: Sequence[ChatMessage]) -> str:
    """The default chat template (ChatML), ending with the assistant's open turn."""
    return "".join(chatml_segments(messages))


class ChatRenderer:
    """Renders chat messages with the model's Jinja template, or ChatML when it has none."""

    def __init__(self, template: str | None) -> None:
        self._template: Any = None
        if template is not None:
            try:
                import jinja2
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise RuntimeError("a model chat template needs jinja2: pip install jinja2") from exc
            env = jinja2.Environment(autoescape=False, keep_trailing_newline=True)
            self._template = env.from_string(template)

    def segments(self, messages: Sequence[ChatMessage]) -> list[str] | None:
        """The rendered prompt split at message boundaries (ChatML), or None for a model template,
        which must be rendered whole."""
        return chatml_segments(messages) if self._template is None else None

    def render(self, messages: Sequence[ChatMessage]) -> str:
        """The prompt text the engine will see for `messages`."""
        if self._template is None:
            return render_chatml(messages)
        plain = [{"role": m.role, "content": message_text(m)} for m in messages]
        rendered: str = self._template.render(messages=plain, add_generation_prompt=True)
        return rendered


def prompt_of(params: GenerationRequest, renderer: ChatRenderer) -> str | list[int]:
    """The request's prompt as text to tokenize, or token ids the client already sent.

    A batched completion (a list of prompts) is routed by its first prompt.
    """
    if isinstance(params, ChatCompletionRequest):
        return renderer.render(params.messages)
    assert isinstance(params, CompletionRequest)
    prompt = params.prompt
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        return ""
    first = prompt[0]
    if isinstance(first, str):
        return first
    if isinstance(first, list):
        return list(first)
    return [int(t) for t in prompt if isinstance(t, int)]
