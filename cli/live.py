"""The live terminal view: generated text coloured by token origin, and the stats panel.

``render`` is pure (state in, renderable out) so it is tested with a recording console;
``cli/stream.py`` drives a rich ``Live`` with it, which redraws a few times a second from
its own thread, so decoding never waits on the terminal.
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
    drafting: bool = False  # a drafter was configured (so "nothing drafted" is worth saying)

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


def render_text(state: LiveState, max_chars: int = MAX_SHOWN_CHARS, max_lines: int | None = None) -> Text:
    """The tail of the generated text (at most ``max_chars`` and ``max_lines``), coloured by origin."""
    budget_chars = max_chars
    budget_lines = max_lines if max_lines is not None else 1 << 30
    shown: list[tuple[str, str]] = []
    cut = False
    for chunk, origin in reversed(state.segments):
        if budget_chars <= 0 or budget_lines <= 0:
            cut = True
            break
        piece = chunk[-budget_chars:]
        lines = piece.split("\n")
        if len(lines) - 1 >= budget_lines:
            piece = "\n".join(lines[-budget_lines:])
            cut = True
        budget_chars -= len(chunk)
        budget_lines -= piece.count("\n")
        shown.append((piece, origin))
        if cut:
            break
    text = Text()
    if cut or budget_chars < 0:
        text.append("… ", style="dim")
    for chunk, origin in reversed(shown):
        text.append(chunk, style=ORIGIN_STYLES.get(origin, ""))
    return text


NOTHING_DRAFTED = "nothing verified: no drafted token was likely enough to pay for its place in a pass"


def render_stats(stats: SpecStats, drafter: bool = False) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    drafting = stats.drafted > 0
    if drafter and not drafting:
        table.add_row("acceptance rate", f"-  ({NOTHING_DRAFTED})")
    if drafting:
        table.add_row("acceptance rate", f"{stats.acceptance_rate:.1%}  ({stats.accepted}/{stats.drafted} drafted)")
        table.add_row("mean accepted length", f"{stats.mean_accepted_length:.2f}")
    table.add_row("tokens per target pass", f"{stats.tokens_per_target_pass:.2f}  ({stats.target_passes} passes"
                                            f"{_declined(stats)})")
    table.add_row("generation throughput", f"{stats.generation_throughput:.1f} tok/s  "
                                           f"({stats.generated_tokens} tokens)")
    busy = stats.draft_seconds + stats.verify_seconds
    if busy > 0:
        table.add_row("draft / verify time", f"{stats.draft_seconds:.2f} s / {stats.verify_seconds:.2f} s  "
                                           f"{_bar(stats.draft_seconds / busy, 12)} draft share")
    table.add_row("prefill", f"{stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f} s")
    if drafting:
        rates = stats.per_position_acceptance
        table.add_row("acceptance by slot", f"{_spark(rates, 1.0)}  slot 1: {rates[0]:.0%} … "
                                            f"slot {len(rates)}: {rates[-1]:.0%}")
        hist = stats.accepted_length_histogram
        top = max(hist) or 1
        mode = hist.index(top)
        table.add_row("accepted per round", f"{_spark(hist, top)}  0 … {len(hist) - 1}; "
                                            f"most often {mode} ({top} of {sum(hist)} rounds)")
    return table


def _declined(stats: SpecStats) -> str:
    """How many passes were plain steps that paid for a draft nobody verified (empty where none)."""
    return f", {stats.declined} of them declined a proposal" if stats.declined else ""


_SPARKS = " ▁▂▃▄▅▆▇█"


def _spark(values: list[float] | list[int], top: float) -> str:
    """One character per value, its height the value's share of ``top``."""
    return "".join(_SPARKS[round(max(0.0, min(1.0, v / top)) * (len(_SPARKS) - 1))] for v in values)


def legend() -> Text:
    text = Text("tokens: ")
    for origin, label in ORIGIN_LABELS.items():
        text.append(label, style=ORIGIN_STYLES[origin] or "default")
        text.append("  ")
    return text


def render(state: LiveState, max_chars: int = MAX_SHOWN_CHARS, max_lines: int | None = None) -> RenderableType:
    """The whole live view for ``state``, showing the tail of the text (``max_chars``, ``max_lines``)."""
    subtitle = f"stopped: {state.stop_reason}" if state.stop_reason else "generating…"
    return Group(
        Panel(render_text(state, max_chars, max_lines), title=state.title, subtitle=subtitle, border_style="blue"),
        Panel(render_stats(state.stats, state.drafting), title="speculation", border_style="magenta"),
        legend(),
    )


def summary_lines(stats: SpecStats, stop_reason: str | None, drafter: bool = False) -> list[str]:
    """The end-of-run report in plain text (also used when stdout is not a terminal)."""
    lines = []
    if drafter and not stats.drafted:
        lines.append(f"acceptance rate: - ({NOTHING_DRAFTED})")
    if stats.drafted:
        lines.append(f"acceptance rate: {stats.acceptance_rate:.1%} "
                     f"({stats.accepted} accepted / {stats.drafted} drafted)")
    lines += [
        f"tokens per target pass: {stats.tokens_per_target_pass:.2f} "
        f"({stats.generated_tokens} tokens in {stats.target_passes} passes{_declined(stats)})",
        f"generation throughput: {stats.generation_throughput:.1f} tok/s "
        f"(prefill excluded; prefill {stats.prompt_tokens} tokens in {stats.prefill_seconds:.2f} s)",
        f"stop reason: {stop_reason}",
    ]
    return lines


def state_json(state: LiveState, tokens: list[int], settings: dict[str, Any]) -> dict[str, Any]:
    """The --json object: text, token ids, stop reason, every stats field, resolved settings."""
    return {"text": state.text, "tokens": tokens, "stop_reason": state.stop_reason,
            "stats": state.stats.as_dict(), "settings": settings}
