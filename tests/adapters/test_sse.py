"""SSE decoding of upstream streams, however the bytes are split."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from adapters.sse import SSEDecoder, SSEEvent


def _decode(*parts: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = [event for part in parts for event in decoder.feed(part)]
    return events + decoder.flush()


def test_data_with_and_without_space() -> None:
    assert [e.data for e in _decode(b'data: {"a":1}\n\ndata:{"b":2}\n\n')] == [b'{"a":1}', b'{"b":2}']


def test_comments_and_other_fields_are_skipped() -> None:
    events = _decode(b": keep-alive\n\nid: 7\nretry: 100\ndata: x\n\n")
    assert [e.data for e in events] == [b"x"]


def test_multi_line_data_joins_with_newline() -> None:
    assert [e.data for e in _decode(b"data: line one\ndata: line two\n\n")] == [b"line one\nline two"]


def test_crlf_and_cr_line_endings() -> None:
    assert [e.data for e in _decode(b"data: a\r\n\r\ndata: b\r\rdata: c\n\n")] == [b"a", b"b", b"c"]


def test_event_type_is_kept_and_reset() -> None:
    events = _decode(b"event: error\ndata: boom\n\ndata: ok\n\n")
    assert [(e.event, e.data) for e in events] == [("error", b"boom"), ("message", b"ok")]


def test_unterminated_last_event_is_flushed() -> None:
    assert [e.data for e in _decode(b"data: [DONE]")] == [b"[DONE]"]


STREAM = b'data: {"id":1}\r\n\r\n: ping\n\ndata:{"id":2}\n\ndata: two\ndata: lines\n\ndata: [DONE]\n\n'


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    parts = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    assert [e.data for e in _decode(*parts)] == [b'{"id":1}', b'{"id":2}', b"two\nlines", b"[DONE]"]
