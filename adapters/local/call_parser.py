"""One choice's generated text, split as it grows into plain content or tool calls and their arguments.

The text is what the grammar (`adapters.local.grammar`) let the model write: plain text (with
`tool_choice` `auto`, an answer that does not start with `<`), or one or more calls back to back in
the form `adapters.local.tool_calls` defines:

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><tool_call>...

A call's arguments end where their JSON value closes (strings and escapes are followed, so a
`}</tool_call>` inside a string is argument text); no argument text is held back. Only the fixed
text around the arguments is, until it is whole, so the streamed pieces of each call join to exactly
its final `arguments`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from adapters.local.tool_calls import CALL_SUFFIX, ToolPlan, call_prefix

_HEAD = call_prefix("")[: -len('", "arguments": ')]  # `<tool_call>{"name": "`
_ARGUMENTS_KEY = '", "arguments": '


@dataclass(slots=True)
class ParsedCall:
    """One call the text made."""

    id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class CallPiece:
    """What one piece of text adds to call `index`: its opening (id and name) and argument text."""

    index: int
    opened: bool
    arguments: str = ""


@dataclass(slots=True)
class CallDelta:
    """What one piece of generated text adds to a choice."""

    content: str = ""
    calls: list[CallPiece] = field(default_factory=list)

    def extend(self, other: CallDelta) -> None:
        """Append `other`'s content and pieces (a piece of the same call is merged)."""
        self.content += other.content
        for piece in other.calls:
            last = self.calls[-1] if self.calls else None
            if last is not None and last.index == piece.index and not piece.opened:
                last.arguments += piece.arguments
            else:
                self.calls.append(piece)


class _JsonEnd:
    """Where a JSON value written one character at a time closes."""

    __slots__ = ("depth", "escaped", "in_string")

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def closes_at(self, text: str) -> int:
        """The length of `text` up to and including the character that closes the value; -1: open."""
        for i, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return -1


class CallParser:
    """One choice's text as content or calls (see the module docstring)."""

    __slots__ = ("_held", "_json", "_mode", "_required", "calls")

    def __init__(self, plan: ToolPlan) -> None:
        self._required = plan.required
        self._held = ""
        self._mode = "start"  # start, text, head (a call's text up to its arguments), args, tail
        self._json = _JsonEnd()
        self.calls: list[ParsedCall] = []

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def push(self, text: str) -> CallDelta:
        """Add generated text; return what of it is now certain."""
        self._held += text
        out = CallDelta()
        while self._held and self._step(out):
            pass
        return out

    def finish(self) -> CallDelta:
        """The text ended: what is still held (never argument text, which is not held) is released.
        Cut short in the wrapper before any call's name, it is plain text after all; after a call,
        it is dropped (neither a call's arguments nor an answer's text)."""
        held, self._held = self._held, ""
        if not held or self.calls:
            return CallDelta()
        return CallDelta(content=held)

    def _step(self, out: CallDelta) -> bool:
        """Take what the held text decides; False when it must wait for more."""
        held = self._held
        if self._mode == "start":
            self._mode = "head" if self._required or held.startswith("<") else "text"
        if self._mode == "text":
            out.content += held
            self._held = ""
            return False
        if self._mode == "head":
            if not (held.startswith(_HEAD) or _HEAD.startswith(held)):
                self._mode = "text"  # not a call's text (the grammar allows none such): plain content
                return True
            end = held.find(_ARGUMENTS_KEY, len(_HEAD))
            if end < 0:
                return False
            call = ParsedCall(f"call_{uuid.uuid4().hex[:24]}", held[len(_HEAD) : end])
            self.calls.append(call)
            out.calls.append(CallPiece(len(self.calls) - 1, True))
            self._held = held[end + len(_ARGUMENTS_KEY) :]
            self._mode, self._json = "args", _JsonEnd()
            return True
        if self._mode == "args":
            closes = self._json.closes_at(held)
            piece = held if closes < 0 else held[:closes]
            self.calls[-1].arguments += piece
            out.extend(CallDelta(calls=[CallPiece(len(self.calls) - 1, False, piece)]))
            self._held = "" if closes < 0 else held[closes:]
            if closes >= 0:
                self._mode = "tail"
            return closes >= 0
        # tail: the wrapper's closing `}</tool_call>`, then the next call or the end.
        if not (held.startswith(CALL_SUFFIX) or CALL_SUFFIX.startswith(held)):
            self._mode = "text"  # not the wrapper (the grammar allows no such text): plain content
            return True
        if len(held) < len(CALL_SUFFIX):
            return False
        self._held = held[len(CALL_SUFFIX) :]
        self._mode = "head"
        return True
