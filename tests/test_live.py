"""The live view's pure render function, recorded; and interrupts during streaming."""

from __future__ import annotations

import pytest
from rich.console import Console

from specdec_cli.live import LiveState, render, summary_lines
from specdec_cli.stream import Interrupted, generate_into
from specdec_gguf import SamplingParams, SpecStats, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter


def recorded(state: LiveState, **kwargs) -> Console:
    console = Console(record=True, width=100, color_system="truecolor", force_terminal=True)
    console.print(render(state, **kwargs))
    return console


def sample_state() -> LiveState:
    stats = SpecStats(prompt_tokens=5)
    stats.record_round(4, 4, 5)
    stats.record_round(4, 1, 2)
    stats.generation_seconds, stats.draft_seconds, stats.verify_seconds = 0.5, 0.1, 0.4
    state = LiveState(title="tiny · draft model", stats=stats)
    for text, origin in [("Hello", "accepted"), (" world", "accepted"), ("!", "correction"),
                         (" Bye", "bonus"), (" now", "target")]:
        state.add(text, origin)
    return state


def test_render_shows_text_and_every_figure():
    text = recorded(sample_state()).export_text()
    assert "Hello world! Bye now" in text
    for label in ("acceptance rate", "62.5%", "5/8 drafted", "mean accepted length", "tokens per target pass",
                  "3.50", "generation throughput", "14.0 tok/s", "draft / verify time", "acceptance by slot",
                  "slot 1: 100%", "slot 4: 50%", "accepted per round", "0 … 4", "prefill"):
        assert label in text, label


def test_sparklines_scale_with_values():
    from specdec_cli.live import _spark

    assert _spark([0.0, 0.5, 1.0], 1.0) == " ▄█"
    assert _spark([0, 3, 6], 6) == " ▄█"


def text_panel_styles(state: LiveState) -> dict[str, set[str]]:
    """For each generated token text, the styles its characters carry in the text panel's line.

    Reads rich's rendered segments (not the exported HTML, where the legend's colours would
    count too): finds the panel line holding the text, and maps each piece to its styles.
    """
    from rich.segment import Segment

    console = Console(width=100, color_system="truecolor", force_terminal=True)
    lines = list(Segment.split_lines(console.render(render(state), console.options)))
    line = next(line for line in lines if state.text in "".join(seg.text for seg in line))
    chars: list[tuple[str, str]] = []  # (character, style) along the line
    for seg in line:
        chars += [(c, str(seg.style or "")) for c in seg.text]
    text = "".join(c for c, _ in chars)
    start = text.index(state.text)
    styles, pos = {}, start
    for piece, _ in state.segments:
        styles[piece] = {style for _, style in chars[pos:pos + len(piece)]}
        pos += len(piece)
    return styles


def assert_tokens_coloured_by_origin() -> None:
    state = LiveState(title="t")
    for piece, origin in [("Hello", "accepted"), ("!", "correction"), (" Bye", "bonus"), (" now", "target")]:
        state.add(piece, origin)
    assert text_panel_styles(state) == {"Hello": {"green"}, "!": {"yellow"}, " Bye": {"bold cyan"}, " now": {""}}


def test_render_colours_tokens_by_origin():
    """Each token's own characters carry its origin's colour (the legend's colours don't count).
    Fails when render_text drops the styles (test_uncoloured_text_is_caught)."""
    assert_tokens_coloured_by_origin()


def test_uncoloured_text_is_caught(monkeypatch):
    """The colour test can fail: a text panel without styles while the legend stays coloured
    (the old check, colours anywhere in the HTML, passed on the legend alone)."""
    import specdec_cli.live as live
    from rich.text import Text

    monkeypatch.setattr(live, "render_text", lambda state, *a, **k: Text(state.text))
    html = recorded(sample_state()).export_html(inline_styles=True)
    assert "color: #008000" in html and "color: #808000" in html and "color: #008080" in html
    with pytest.raises(AssertionError):
        assert_tokens_coloured_by_origin()


def test_render_shows_tail_of_long_text():
    state = LiveState(title="t")
    state.add("A" * 5000 + "THE END", "target")
    text = recorded(state, max_chars=300).export_text()
    assert "THE END" in text and "…" in text
    assert text.count("A") < 400


def test_render_keeps_last_lines_only():
    state = LiveState(title="t")
    state.add("".join(f"line {i}\n" for i in range(100)), "target")
    text = recorded(state, max_lines=5).export_text()
    assert "line 99" in text and "line 96" in text and "line 94" not in text  # 4 lines + the open one


def test_declined_rounds_are_told_where_there_were_any():
    """Passes that declined a proposal (plain steps that paid for a draft) are counted beside the passes, in
    the live view and the end-of-run lines; with none, nothing is said of them."""
    stats = SpecStats()
    stats.record_round(3, 3, 4)
    stats.record_round(0, 0, 1, declined=True)
    stats.generation_seconds = 0.1
    text = recorded(LiveState(title="t", stats=stats)).export_text()
    assert "(2 passes, 1 of them declined a proposal)" in text
    assert summary_lines(stats, "length")[1] == "tokens per target pass: 2.50 (5 tokens in 2 passes, 1 of them " \
                                               "declined a proposal)"
    quiet = SpecStats()
    quiet.record_round(3, 3, 4)
    assert "declined" not in recorded(LiveState(title="t", stats=quiet)).export_text()


def test_plain_decoding_view_hides_draft_rows():
    stats = SpecStats()
    stats.record_round(0, 0, 1)
    stats.generation_seconds = 0.1
    text = recorded(LiveState(title="plain", stats=stats)).export_text()
    assert "acceptance rate" not in text and "tokens per target pass" in text
    assert summary_lines(stats, "length")[0].startswith("tokens per target pass: 1.00")


class ExplodingDecoder:
    """A decoder whose stream is interrupted (Ctrl-C) after two rounds."""

    def __init__(self, real: SpeculativeDecoder) -> None:
        self.real = real

    def stream(self, *args, **kwargs):
        for i, event in enumerate(self.real.stream(*args, **kwargs)):
            if i == 2:
                raise KeyboardInterrupt
            yield event


@pytest.mark.parametrize("mode", ["plain", "live", "quiet"])
def test_interrupt_keeps_partial_text_and_stats(tiny_engines, mode, capsys):
    target, draft = tiny_engines
    decoder = ExplodingDecoder(SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=3, adaptive=False))
    state = LiveState(title="t")
    console = Console(record=True, force_terminal=True, width=80)
    with pytest.raises(Interrupted) as caught:
        generate_into(state, decoder, target, target.tokenize("the model is"), 50, SamplingParams(), mode, console)
    assert caught.value.state.stop_reason == "interrupted"
    assert len(caught.value.tokens) >= 2
    assert caught.value.state.stats.target_passes == 2
    assert caught.value.state.stats.generated_tokens == len(caught.value.tokens)
    assert state.text  # the partial text is kept
