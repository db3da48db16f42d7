"""`specdec bench`: plain vs speculative strategies on the same loaded models, interleaved, with repeats."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from specdec_gguf import ConfigError
from specdec_gguf.benchmark import (PEER_NAME, Strategy, measure_cost_curve, peer_strategy, run_peer_trials,
                                     run_trials, summarize)
from specdec_gguf.config import DrafterSettings, EngineSettings, read_prompts_jsonl
from specdec_gguf.factory import open_engine
from specdec_gguf.prompts import BENCH_PROMPTS

from .common import err_console, handle_errors, stdout_is_tty

BAR = 30


def strategies_for(draft: bool, prompt_lookup: bool, ks: list[int], adaptive_k: int,
                   ngram_max: int) -> list[Strategy]:
    out = [Strategy("plain", DrafterSettings(kind="none"))]
    kinds = (["draft-model"] if draft else []) + (["prompt-lookup"] if prompt_lookup else [])
    for kind in kinds:
        short = "draft" if kind == "draft-model" else "lookup"
        for k in ks:
            out.append(Strategy(f"{short} k={k}", DrafterSettings(kind=kind, num_draft_tokens=k, adaptive=False,
                                                                  ngram_max=ngram_max)))
        out.append(Strategy(f"{short} adaptive", DrafterSettings(kind=kind, num_draft_tokens=adaptive_k,
                                                                 adaptive=True, ngram_max=ngram_max)))
    return out


def render_reports(reports) -> Table:
    table = Table(title="specdec bench (greedy)", header_style="bold")
    for col in ("strategy", "median tok/s", "vs plain", "acceptance", "tokens/pass", "optimum", "of optimum",
                "same as plain", "python share"):
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for r in reports:
        table.add_row(r.name, f"{r.median_throughput:.1f}", f"{r.speedup:.2f}x",
                      f"{r.acceptance_rate:.1%}" if r.name not in ("plain", PEER_NAME) else "-",
                      f"{r.tokens_per_target_pass:.2f}" if r.name != PEER_NAME else "-",
                      f"{r.predicted_optimum:.2f}x" if r.predicted_optimum else "-",
                      f"{r.share_of_optimum:.0%}" if r.share_of_optimum else "-",
                      f"{r.greedy_match:.0%}" if r.greedy_match is not None else "-",
                      f"{r.python_share:.1%}" if r.python_share is not None else "-")
    return table


def per_prompt_table(reports) -> Table:
    """Speed-up over plain decoding per prompt and strategy."""
    prompt_ids = list(reports[0].per_prompt_speedup) if reports else []
    table = Table(title="speed-up over plain, per prompt", header_style="bold")
    table.add_column("strategy", no_wrap=True)
    for pid in prompt_ids:
        table.add_column(pid, justify="right", no_wrap=True)
    for r in reports:
        table.add_row(r.name, *(f"{r.per_prompt_speedup[pid]:.2f}x" for pid in prompt_ids))
    return table


def speedup_chart(reports) -> list[str]:
    lines = ["speed-up over plain decoding:"]
    top = max([r.speedup for r in reports] + [1.0])
    for r in reports:
        n = round(r.speedup / top * BAR)
        lines.append(f"  {r.name:<24} {'█' * n}{' ' * (BAR - n)} {r.speedup:.2f}x")
    return lines


@handle_errors
def bench(
    model: Annotated[Path, typer.Option("-m", "--model", help="Target GGUF model.")],
    draft_model: Annotated[Optional[Path], typer.Option("-md", "--draft-model", help="Draft model strategies.")] = None,
    prompt_lookup: Annotated[bool, typer.Option("--prompt-lookup/--no-prompt-lookup", help="Prompt lookup strategies.")] = True,
    ks: Annotated[str, typer.Option("--k", help="Fixed k values to sweep, comma-separated.")] = "1,2,4,8",
    adaptive_k: Annotated[int, typer.Option("--adaptive-k", help="Largest k the adaptive schedule may choose.")] = 8,
    ngram_max: Annotated[int, typer.Option("--ngram-max")] = 3,
    prompts_file: Annotated[Optional[Path], typer.Option("--prompts", help="JSONL prompts (id, text); default: the built-in set.")] = None,
    only: Annotated[Optional[str], typer.Option("--only", help="Comma-separated prompt ids to run.")] = None,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens")] = 128,
    repeats: Annotated[int, typer.Option("--repeats", help="Interleaved repeats per prompt.")] = 3,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size")] = 2048,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads")] = None,
    n_gpu_layers: Annotated[int, typer.Option("-ngl", "--n-gpu-layers")] = 0,
    draft_n_gpu_layers: Annotated[int, typer.Option("-ngld", "--draft-n-gpu-layers")] = 0,
    peer: Annotated[Optional[str], typer.Option("--peer", help="Add a peer implementation: llama-cpp-python.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable results.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Measure plain decoding against speculative strategies on the same prompts."""
    try:
        k_values = [int(k) for k in ks.split(",") if k.strip()]
    except ValueError:
        raise ConfigError(f"--k {ks!r} must be comma-separated integers") from None
    if any(k < 1 for k in k_values) or repeats < 1 or max_tokens < 1:
        raise ConfigError(f"--k values ({ks}), --repeats ({repeats}) and -n ({max_tokens}) must be >= 1")
    if peer not in (None, "llama-cpp-python"):
        raise ConfigError(f"--peer {peer!r}: the only peer is 'llama-cpp-python'")
    prompts = ([(p.id, p.text) for p in read_prompts_jsonl(prompts_file, "--prompts")] if prompts_file
               else [(pid, text) for pid, _, text in BENCH_PROMPTS])
    if only:
        wanted = only.split(",")
        prompts = [p for p in prompts if p[0] in wanted]
        if not prompts:
            raise ConfigError(f"--only {only!r} matches no prompt id")
    target = open_engine(EngineSettings(model=model, n_ctx=ctx_size, n_threads=threads,
                                        n_gpu_layers=n_gpu_layers), verbose=verbose)
    draft = None
    try:
        if draft_model:
            draft = open_engine(EngineSettings(model=draft_model, n_ctx=ctx_size, n_threads=threads,
                                               n_gpu_layers=draft_n_gpu_layers), verbose=verbose)
        strategies = strategies_for(draft is not None, prompt_lookup, k_values, adaptive_k, ngram_max)
        tokenized = [(pid, target.tokenize(text)) for pid, text in prompts]
        curve = measure_cost_curve(target, tokenized[0][1], sorted({1, *(k + 1 for k in k_values)}))
        progress = err_console if not json_out else None
        trials = run_trials(target, draft, strategies, tokenized, max_tokens, repeats,
                            on_trial=(lambda t: progress.print(f"  {t.prompt_id:<14} {t.strategy:<18} "
                                                               f"{t.throughput:7.1f} tok/s", highlight=False, markup=False))
                            if progress else None)
    finally:
        for engine in (draft, target):
            if engine is not None:
                engine.close()
    if peer:
        from specdec_gguf.engines.llama_cpp.peer import PeerPromptLookup

        peer_engine = PeerPromptLookup(model, n_ctx=ctx_size, n_threads=threads)
        try:
            trials += run_peer_trials(peer_engine, tokenized, max_tokens, repeats)
        finally:
            peer_engine.close()
        strategies.append(peer_strategy())
    reports = summarize(trials, strategies, curve)
    if json_out:
        print(json.dumps({"reports": [dataclasses.asdict(r) for r in reports],
                          "cost_curve_seconds": curve, "prompts": [p[0] for p in prompts],
                          "max_tokens": max_tokens, "repeats": repeats}))
        return
    console = Console(highlight=False, width=None if stdout_is_tty() else 160)
    console.print(render_reports(reports))
    console.print(per_prompt_table(reports))
    console.print("verify cost vs one-token pass: " + ", ".join(
        f"{n}: {curve[n] / curve[1]:.2f}x" for n in sorted(curve)))
    for line in speedup_chart(reports):
        console.print(line)

