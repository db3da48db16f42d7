"""The live terminal view: generated text coloured by token origin, and the stats panel.

``render`` is pure (state in, renderable out) so it is tested with a recording console;
``LiveView`` drives a rich ``Live`` that redraws a few times a second from its own
thread, so decoding never waits on the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specdec_gguf import SpecStats

ORIGIN_STYLES = {"accepted": "green", "correction": "yellow", "bonus": "bold cyan", "target": ""}
ORIGIN_LABELS = {"accepted": "accepted draft", "correction": "correction", "bonus": "bonus", "target": "plain"}
MAX_SHOWN_CHARS = 4000  # the view shows the tail of long outputs
BAR_WIDTH = 24


@dataclass
class LiveState:
    """What the view shows: the text so far as (text, origin) segments, and the stats."""

    title: str
    stats: SpecStats = field(default_factory=SpecStats)
    segments: list[tuple[str, str]] = field(default_factory=list)
    stop_reason: str | None = None

    def add(self, text: str, origin: str) -> None:
        if not text:
            return
        if self.segments and self.segments[-1][1] == origin:
            self.segments[-1] = (self.segments[-1][0] + text, origin)
        else:
            self.segments.append((text, origin))

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)


def _bar(share: float, width: int = BAR_WIDTH) -> str:
    filled = round(max(0.0, min(1.0, share)) * width)
    return "█" * filled + "░" * (width - filled)


def render_text(state: LiveState, max_chars: int = MAX_SHOWN_CHARS) -> Text:
    text = Text()
    budget = max_chars
    shown: list[tuple[str, str]] = []
    for chunk, origin in reversed(state.segments):
        if budget <= 0:
            break
        shown.append((chunk[-budget:], origin))
        budget -= len(chunk)
    if budget <= 0:
        text.append("… ", style="dim")
    for chunk, origin in reversed(shown):
        text.append(chunk, style=ORIGIN_STYLES.get(origin, ""))
    return text


def render_stats(stats: SpecStats) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    drafting = stats.drafted > 0
    if drafting:
        table.add_row("acceptance rate", f"{stats.acceptance_rate:.1%}  ({stats.accepted}/{stats.drafted} drafted)")
        table.add_row("mean accepted length", f"{stats.mean_accepted_length:.2f}")
    table.add_row("tokens per target pass", f"{stats.tokens_per_target_pass:.2f}  ({stats.target_passes} passes)")
    table.add_row("generation throughput", f"{stats.generation_throughput:.1f} tok/s  "
                                           f"({stats.generated_tokens} tokens)")
    busy = stats.draft_seconds + stats.verify_seconds
    if busy > 0:
        table.add_row("draft / verify time", f"{stats.draft_seconds:.2f} s / {stats.verify_seconds:.2f} s  "
                                           f"{_bar(stats.draft_seconds / busy, 12)} draft share")
    table.add_row("prefill", f"{stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f} s")
    if drafting:
        for i, rate in enumerate(stats.per_position_acceptance):
            table.add_row(f"  slot {i + 1} accepted", f"{_bar(rate)} {rate:5.1%}  (n={stats.per_position_drafted[i]})")
        rounds = max(sum(stats.accepted_length_histogram), 1)
        for m, count in enumerate(stats.accepted_length_histogram):
            table.add_row(f"  {m} accepted", f"{_bar(count / rounds)} {count}")
    return table


def legend() -> Text:
    text = Text("tokens: ")
    for origin, label in ORIGIN_LABELS.items():
        text.append(label, style=ORIGIN_STYLES[origin] or "default")
        text.append("  ")
    return text


def render(state: LiveState, max_chars: int = MAX_SHOWN_CHARS) -> RenderableType:
    """The whole live view for ``state``, showing at most the last ``max_chars`` of text."""
    subtitle = f"stopped: {state.stop_reason}" if state.stop_reason else "generating…"
    return Group(
        Panel(render_text(state, max_chars), title=state.title, subtitle=subtitle, border_style="blue"),
        Panel(render_stats(state.stats), title="speculation", border_style="magenta"),
        legend(),
    )


def summary_lines(stats: SpecStats, stop_reason: str | None) -> list[str]:
    """The end-of-run report in plain text (also used when stdout is not a terminal)."""
    lines = []
    if stats.drafted:
        lines.append(f"acceptance rate: {stats.acceptance_rate:.1%} "
                     f"({stats.accepted} accepted / {stats.drafted} drafted)")
    lines += [
        f"tokens per target pass: {stats.tokens_per_target_pass:.2f} "
        f"({stats.generated_tokens} tokens in {stats.target_passes} passes)",
        f"generation throughput: {stats.generation_throughput:.1f} tok/s "
        f"(prefill excluded; prefill {stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f} s)",
        f"stop reason: {stop_reason}",
    ]
    return lines


def state_json(state: LiveState, tokens: list[int], settings: dict[str, Any]) -> dict[str, Any]:
    """The --json object: text, token ids, stop reason, every stats field, resolved settings."""
    return {"text": state.text, "tokens": tokens, "stop_reason": state.stop_reason,
            "stats": state.stats.as_dict(), "settings": settings}
