"""Streaming detokenization that never emits half a UTF-8 character."""

from __future__ import annotations

import codecs
from typing import Callable, Iterable


class TextStream:
    """Turn token ids into text incrementally.

    Bytes of a character split across tokens are held back until complete; bytes
    that can never form valid UTF-8 become U+FFFD, exactly as a one-shot
    ``bytes.decode("utf-8", errors="replace")`` of all pieces would. So the
    concatenation of every ``push`` and the final ``flush`` equals the one-shot text.
    """

    def __init__(self, token_to_piece: Callable[[int], bytes]) -> None:
        self._piece = token_to_piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tokens: Iterable[int]) -> str:
        """The text that ``tokens`` complete (may be empty while a character is split)."""
        return self._decoder.decode(b"".join(self._piece(t) for t in tokens))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete tail becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
