"""Output text: stop strings held back until decided, and only whole UTF-8 characters."""

from __future__ import annotations

from adapters.local.loader import LoadedModel
from adapters.local.text_stream import TextStream
from adapters.local.tokenizer import IncrementalDecoder


def feed(loaded: LoadedModel, text: str, stop: tuple[str, ...]) -> tuple[list[str], bool]:
    stream = TextStream(loaded.tokenizer, stop)
    pieces = []
    for token in loaded.tokenizer.encode(text):
        piece, stopped = stream.push(token)
        pieces.append(piece)
        if stopped:
            return pieces, True
    pieces.append(stream.finish())
    return pieces, False


def test_stop_string_ends_the_text_before_it(loaded: LoadedModel) -> None:
    pieces, stopped = feed(loaded, "one two three four five", ("three",))
    assert stopped and "".join(pieces) == "one two "


def test_a_stop_string_split_across_tokens_is_caught(loaded: LoadedModel) -> None:
    text = "alpha<|STOP|>beta"
    assert len(loaded.tokenizer.encode("<|STOP|>")) > 1
    pieces, stopped = feed(loaded, text, ("<|STOP|>",))
    assert stopped and "".join(pieces) == "alpha"
    assert not any("<" in p for p in pieces)  # the possible start was held back, never emitted


def test_a_false_start_is_released_once_it_cannot_match(loaded: LoadedModel) -> None:
    pieces, stopped = feed(loaded, "a <| b <|STOP c", ("<|STOP|>",))
    assert not stopped and "".join(pieces) == "a <| b <|STOP c"


def test_earliest_of_several_stop_strings_wins(loaded: LoadedModel) -> None:
    pieces, stopped = feed(loaded, "first, then; finally.", (";", ","))
    assert stopped and "".join(pieces) == "first"


def test_partial_utf8_is_held_back_until_the_character_completes(loaded: LoadedModel) -> None:
    tokenizer = loaded.tokenizer
    text = "ok 🦜 done"
    ids = tokenizer.encode(text)
    decoder = IncrementalDecoder(tokenizer)
    outputs = [decoder.push(t) for t in ids]
    assert all("\ufffd" not in out for out in outputs)
    assert "".join(outputs) + decoder.flush() == text == tokenizer.decode(ids)
    # The emoji's four bytes arrive over three tokens (" \xf0\x9f", "\xa6", "\x9c"): the space goes out
    # at once, the emoji only when its last byte does.
    assert [tokenizer.token_bytes[t] for t in ids[1:4]] == [b" \xf0\x9f", b"\xa6", b"\x9c"]
    assert outputs == ["ok", " ", "", "\U0001f99c", " done"]


def test_a_dangling_partial_character_flushes_as_replacement(loaded: LoadedModel) -> None:
    tokenizer = loaded.tokenizer
    ids = tokenizer.encode("🦜")
    assert len(ids) > 1
    decoder = IncrementalDecoder(tokenizer)
    assert decoder.push(ids[0]) == ""
    assert decoder.flush() == "\ufffd"
