"""Drive one generation and show it: live view, plain streamed text, or nothing (--json)."""

from __future__ import annotations

import sys
from typing import Iterable, Literal, Sequence

from rich.console import Console
from rich.live import Live

from specdec_gguf import SamplingParams, SpeculativeDecoder
from specdec_gguf.textgen import stream_text

from .live import LiveState, render

Mode = Literal["live", "plain", "quiet"]


class Interrupted(Exception):
    """Ctrl-C during generation; carries what was generated so far."""

    def __init__(self, state: LiveState, tokens: list[int]) -> None:
        super().__init__("interrupted")
        self.state, self.tokens = state, tokens


def generate_into(state: LiveState, decoder: SpeculativeDecoder, target, prompt_tokens: list[int],
                  max_tokens: int, sampling: SamplingParams, mode: Mode,
                  console: Console | None = None, stop_token_ids: Iterable[int] = (),
                  stop: Sequence[str] = ()) -> list[int]:
    """Generate, filling ``state`` as rounds arrive; returns the token ids.

    Raises Interrupted (after restoring the terminal) on Ctrl-C.
    """
    console = console or Console()
    tokens: list[int] = []

    def consume() -> None:
        for event in stream_text(decoder, target.token_to_piece, prompt_tokens, max_tokens, sampling,
                                 stop_token_ids=stop_token_ids, stop=stop):
            state.stats = event.stats.copy()  # a snapshot that matches the tokens shown
            for piece, origin in event.pieces:
                state.add(piece, origin)
            if mode == "plain":
                sys.stdout.write(event.text)
                if event.stop_reason is not None:
                    sys.stdout.write("\n")
                sys.stdout.flush()
            tokens.extend(event.tokens)
            state.stop_reason = event.stop_reason

    def consume_or_stop() -> None:
        try:
            consume()
        except KeyboardInterrupt:
            state.stop_reason = "interrupted"  # set before the live view draws its last frame
            raise Interrupted(state, tokens) from None

    if mode == "live":
        # Leave room for the stats panel (about 14 lines) below the text.
        max_lines = max(3, console.size.height - 16)
        max_chars = max_lines * max(console.size.width - 4, 20)
        with Live(get_renderable=lambda: render(state, max_chars, max_lines), console=console,
                  refresh_per_second=4, transient=False):
            consume_or_stop()
    else:
        consume_or_stop()
    return tokens
