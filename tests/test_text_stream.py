"""Streaming detokenization never emits half a character, and ends equal to the one-shot text."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_gguf.text import TextStream


def stream_all(pieces: list[bytes]) -> tuple[list[str], str]:
    stream = TextStream(lambda i: pieces[i])
    parts = [stream.push([i]) for i in range(len(pieces))]
    return parts, "".join(parts) + stream.flush()


def test_split_multibyte_character_waits_for_its_last_byte():
    snowman = "☃".encode()  # 3 bytes
    parts, text = stream_all([b"a", snowman[:1], snowman[1:2], snowman[2:], b"b"])
    assert parts == ["a", "", "", "☃", "b"]
    assert text == "a☃b"


def test_invalid_bytes_become_replacement_like_one_shot_decode():
    pieces = [b"ok ", b"\xff", b"\xe2\x98", b" end"]
    _, text = stream_all(pieces)
    assert text == b"".join(pieces).decode("utf-8", errors="replace")


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=40), st.lists(st.integers(1, 5), min_size=1, max_size=40))
def test_any_split_of_valid_text_never_shows_broken_characters(text, cuts):
    data = text.encode("utf-8")
    pieces, i = [], 0
    for cut in cuts:
        pieces.append(data[i:i + cut])
        i += cut
    pieces.append(data[i:])
    parts, joined = stream_all(pieces)
    assert all("\ufffd" not in p for p in parts) or "\ufffd" in text
    assert joined == text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=4), max_size=30))
def test_arbitrary_bytes_end_equal_to_one_shot(pieces):
    _, joined = stream_all(pieces)
    assert joined == b"".join(pieces).decode("utf-8", errors="replace")
