"""Incremental Server-Sent Events decoding for upstream streams.

Follows the WHATWG event-stream rules that matter for OpenAI-style streams: lines end in
`\\n`, `\\r\\n` or `\\r`; `data:` with or without a space; several `data:` lines in one event
join with `\\n`; lines starting with `:` are comments; a blank line ends the event. The
`event` field is kept so an `event: error` can be told apart from a chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

DONE = b"[DONE]"
"""The payload OpenAI-compatible servers send as the last event of a stream."""


@dataclass(slots=True)
class SSEEvent:
    """One dispatched event: its `data` (lines joined with `\\n`) and its `event` type."""

    data: bytes
    event: str = "message"


class SSEDecoder:
    """Feed raw bytes as they arrive; get back every event they complete."""

    __slots__ = ("_data", "_event", "_pending")

    def __init__(self) -> None:
        self._pending = b""
        self._data: list[bytes] = []
        self._event = "message"

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode `chunk` together with whatever an earlier chunk left unfinished."""
        buffer = self._pending + chunk if self._pending else chunk
        lines = buffer.splitlines(keepends=True)
        self._pending = b""
        # An unterminated last line waits for more bytes; so does one ending in a lone `\r`,
        # which may be the first half of a `\r\n` split across reads.
        if lines and not lines[-1].endswith(b"\n"):
            self._pending = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            self._line(line.rstrip(b"\r\n"), events)
        return events

    def flush(self) -> list[SSEEvent]:
        """End of stream: finish a last line or event the server did not terminate."""
        events: list[SSEEvent] = []
        if self._pending:
            self._line(self._pending.rstrip(b"\r\n"), events)
            self._pending = b""
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                events.append(SSEEvent(b"\n".join(self._data), self._event))
            self._data = []
            self._event = "message"
            return
        if line[0] == 0x3A:  # ":" starts a comment (keep-alive pings)
            return
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
