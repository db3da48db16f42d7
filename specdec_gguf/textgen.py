"""Text generation: decoder rounds -> text deltas, with stop strings and whole UTF-8 characters.

What ``specdec run``, batch runs and the server share: the decoder's token stream,
detokenized incrementally (:class:`~specdec_gguf.text.TextStream`), passed through a
:class:`~specdec_gguf.stopping.StopStringMatcher`, with each piece of text still
attributed to the origin of the token it came from (for the live view).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Literal, Sequence

from .decoder import Origin, SpeculativeDecoder
from .sampling import SamplingParams
from .stats import SpecStats
from .stopping import StopStringMatcher
from .text import TextStream

TextStopReason = Literal["eog", "stop_token", "length", "context", "stop_string"]


@dataclass(frozen=True)
class TextEvent:
    """One round as text: the new text (split into pieces by token origin), the tokens it kept, the stats.

    ``tokens`` excludes tokens past a stop string's end (the decoder may have committed a
    few more in the same round). ``stop_reason`` is set on the last event only.
    """

    text: str
    pieces: tuple[tuple[str, Origin], ...]
    tokens: tuple[int, ...]
    stats: SpecStats
    stop_reason: TextStopReason | None = None


def stream_text(decoder: SpeculativeDecoder, token_to_piece: Callable[[int], bytes], prompt_tokens: Sequence[int],
                max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                stop_token_ids: Iterable[int] | None = None, stop: Sequence[str] = (),
                ignore_eog: bool = False) -> Iterator[TextEvent]:
    """Generate and yield one TextEvent per decoder round; the last carries the stop reason.

    Closing the iterator early (a client went away) closes the decoder's stream, which leaves
    the target's cache and its record consistent (``SpeculativeDecoder`` restores on exit).
    """
    rounds = decoder.stream(prompt_tokens, max_new_tokens, sampling, stop_token_ids, ignore_eog=ignore_eog)
    return _text_events(rounds, token_to_piece, StopStringMatcher(stop) if stop else None)


def _text_events(rounds, token_to_piece, matcher: StopStringMatcher | None) -> Iterator[TextEvent]:
    utf8 = TextStream(token_to_piece)
    pending: list[list] = []  # [text, origin] not yet released (held back by the matcher)
    ends: list[int] = []  # ends[i]: characters of text once token i is decoded
    total = 0
    try:
        for event in rounds:
            produced = []
            for token, origin in zip(event.tokens, event.origins):
                piece = utf8.push([token])
                total += len(piece)
                ends.append(total)
                produced.append(piece)
                if piece:
                    pending.append([piece, origin])
            chunk = "".join(produced)
            stop_reason: TextStopReason | None = event.stop_reason
            if stop_reason is not None:
                tail = utf8.flush()
                chunk += tail
                if tail:
                    pending.append([tail, event.origins[-1] if event.origins else "target"])
            released = matcher.push(chunk) if matcher else chunk
            tokens = event.tokens
            if matcher is not None and matcher.matched is not None:
                # Keep the tokens up to the one that completed the stop string.
                kept = bisect.bisect_left(ends, matcher.released + len(matcher.matched)) + 1
                tokens = event.tokens[:max(0, kept - (len(ends) - len(event.tokens)))]
                stop_reason = "stop_string"
            elif stop_reason is not None and matcher is not None:
                released += matcher.flush()
            yield TextEvent(released, _take(pending, len(released)), tuple(tokens), event.stats, stop_reason)
            if stop_reason is not None:
                return
    finally:
        rounds.close()


def _take(pending: list[list], n: int) -> tuple[tuple[str, Origin], ...]:
    """Remove the first ``n`` characters from ``pending`` and return them as (text, origin) pieces."""
    out = []
    while n > 0 and pending:
        text, origin = pending[0]
        if len(text) <= n:
            out.append((text, origin))
            pending.pop(0)
            n -= len(text)
        else:
            out.append((text[:n], origin))
            pending[0][0] = text[n:]
            n = 0
    return tuple(out)
