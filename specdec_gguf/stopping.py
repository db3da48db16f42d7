"""Stop strings: find them in streamed text across token boundaries, never emitting part of one."""

from __future__ import annotations

from typing import Sequence

from .errors import ConfigError

MAX_STOP_STRINGS = 16  # more than any client sends (OpenAI allows 4); bounds the per-chunk scan


def check_stop_strings(stops: object, where: str = "stop") -> tuple[str, ...]:
    """Validate a stop list (a string or a list of non-empty strings) and return it as a tuple."""
    if stops is None:
        return ()
    if isinstance(stops, str):
        stops = [stops]
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise ConfigError(f"{where}={stops!r} must be a string or a list of non-empty strings")
    if len(stops) > MAX_STOP_STRINGS:
        raise ConfigError(f"{where} has {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed")
    return tuple(dict.fromkeys(stops))


class StopStringMatcher:
    """Pass text through in chunks; release only text that cannot be the start of a stop string.

    The match is the occurrence that ends first in the text (the longest stop string,
    when several end at the same character), so the result doesn't depend on how the
    text was split into chunks: generation ends as soon as any stop string is complete.
    After a match, ``matched`` names it and everything from its start on is dropped.
    The concatenation of every ``push`` and the final ``flush`` is the text up to the match
    (or all of it when nothing matched).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = check_stop_strings(list(stops))
        self.matched: str | None = None
        self.released = 0  # characters released so far
        self._held = ""

    def push(self, text: str) -> str:
        """The text that is now certain not to belong to a stop string (possibly empty)."""
        if self.matched is not None:
            return ""
        buf = self._held + text
        best_end = best_start = -1
        for stop in self.stops:
            # The earliest start of one stop string is also its earliest end.
            start = buf.find(stop)
            if start >= 0:
                end = start + len(stop)
                if best_end < 0 or end < best_end or (end == best_end and start < best_start):
                    best_end, best_start, self.matched = end, start, stop
        if self.matched is not None:
            self._held = ""
            return self._release(buf[:best_start])
        keep = self._partial_length(buf)
        self._held = buf[len(buf) - keep:]
        return self._release(buf[:len(buf) - keep])

    def flush(self) -> str:
        """The text held back at the end of generation (a stop string that never completed)."""
        held, self._held = self._held, ""
        return self._release(held)

    def _release(self, text: str) -> str:
        self.released += len(text)
        return text

    def _partial_length(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
