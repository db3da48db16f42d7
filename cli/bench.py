"""`specdec bench`: plain vs speculative strategies on the same loaded models, interleaved, with repeats."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from specdec_gguf import ConfigError, SamplingParams
from specdec_gguf.benchmark import (PEER_NAME, Strategy, StrategyReport, geomean, peer_strategy, run_peer_trials,
                                     run_trials, summarize)
from specdec_gguf.factory import open_engine
from specdec_gguf.profile import profile_for
from specdec_gguf.prompts import PROMPT_SETS, chosen_prompts
from specdec_gguf.settings import DrafterSettings, EngineSettings

from .common import (attention_json, err_console, exact_flag, exactness_json, handle_errors, report_exactness,
                     stdout_is_tty)
from .options import MinPOpt, SeedOpt, TempOpt, TopKOpt, TopPOpt, sampling_params

BAR = 30
PEERS = ("llama-cpp-python", "llama.cpp")


PLAIN_AGAIN = "plain again"


def strategies_for(draft: bool, prompt_lookup: bool, ks: list[int], adaptive_k: int | None,
                   ngram_max: int, plain_twice: bool = False) -> list[Strategy]:
    out = [Strategy("plain", DrafterSettings(kind="none"))]
    if plain_twice:  # (a second plain arm: its ratios to the first are this host's noise alone)
        out.append(Strategy(PLAIN_AGAIN, DrafterSettings(kind="none")))
    kinds = (["draft-model"] if draft else []) + (["prompt-lookup"] if prompt_lookup else [])
    for kind in kinds:
        short = "draft" if kind == "draft-model" else "lookup"
        for k in ks:
            out.append(Strategy(f"{short} k={k}", DrafterSettings(kind=kind, num_draft_tokens=k, adaptive=False,
                                                                  ngram_max=ngram_max)))
        out.append(Strategy(f"{short} adaptive", DrafterSettings(kind=kind, num_draft_tokens=adaptive_k,
                                                                 adaptive=True, ngram_max=ngram_max)))
    return out


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _spread(spread: tuple[float, float] | None) -> str:
    return f"{spread[0]:.2f}-{spread[1]:.2f}x" if spread else "-"


def render_reports(reports: list[StrategyReport], cold: bool, sampling: SamplingParams = SamplingParams()) -> Table:
    table = Table(title=f"specdec bench ({describe_sampling(sampling)}, "
                        f"{'cold: a fresh decoder per trial' if cold else 'warm decoders'})", header_style="bold")
    for col in ("strategy", "median tok/s", "vs plain", "paired", "paired by repeat", "acceptance", "tokens/pass", "declined", "vs best fixed k",
                "same as plain", "python share"):
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for r in reports:
        ours, drafts = not r.peer, not (r.peer or r.plain)
        table.add_row(r.name, f"{r.median_throughput:.1f}", _x(r.speedup), _x(r.paired_speedup) if ours else "-",
                      _spread(r.paired_spread) if ours and r is not reports[0] else "-",  # (the first: the reference)
                      f"{r.acceptance_rate:.1%}" if drafts else "-",
                      f"{r.tokens_per_target_pass:.2f}" if ours else "-",
                      f"{r.declined:.1f}" if drafts else "-",
                      _x(r.vs_best_fixed_geomean),
                      f"{r.greedy_match:.0%}" if r.greedy_match is not None else "-",
                      f"{r.python_share:.1%}" if r.python_share is not None else "-")
    return table


def per_prompt_table(reports: list[StrategyReport]) -> Table:
    """Speed-up over plain decoding per prompt and strategy, and adaptive against the best fixed k."""
    prompt_ids = list(reports[0].per_prompt_speedup) if reports else []
    table = Table(title="speed-up over plain, per prompt", header_style="bold")
    table.add_column("strategy", no_wrap=True)
    for pid in prompt_ids:
        table.add_column(pid, justify="right", no_wrap=True)
    for r in reports:
        # ≠: this output is not plain decoding's (a near-tie tipped by batched passes): another answer's speed
        table.add_row(r.name, *(_x(r.per_prompt_speedup.get(pid)) + (" ≠" if r.same_output.get(pid) is False else "")
                                for pid in prompt_ids))
    for r in reports:
        if r.vs_best_fixed:
            table.add_row(f"{r.name} / best fixed k", *(_x(r.vs_best_fixed.get(pid)) for pid in prompt_ids),
                          style="dim")
    return table


def describe_sampling(sampling: SamplingParams) -> str:
    """``greedy``, or the sampling settings that are not off."""
    if sampling.greedy:
        return "greedy"
    parts = [f"temperature {sampling.temperature:g}"]
    parts += [f"top-k {sampling.top_k}"] if sampling.top_k else []
    parts += [f"top-p {sampling.top_p:g}"] if sampling.top_p < 1.0 else []
    parts += [f"min-p {sampling.min_p:g}"] if sampling.min_p > 0.0 else []
    return ", ".join(parts)


def speedup_chart(reports: list[StrategyReport]) -> list[str]:
    lines = ["speed-up over plain decoding:"]
    top = max([r.speedup for r in reports] + [1.0])
    for r in reports:
        n = round(r.speedup / top * BAR)
        lines.append(f"  {r.name:<26} {'█' * n}{' ' * (BAR - n)} {r.speedup:.2f}x")
    return lines


@handle_errors
def bench(
    model: Annotated[Path, typer.Option("-m", "--model", help="Target GGUF model.")],
    draft_model: Annotated[Optional[Path], typer.Option("-md", "--draft-model", "--model-draft", help="Draft model strategies.")] = None,
    prompt_lookup: Annotated[bool, typer.Option("--prompt-lookup/--no-prompt-lookup", help="Prompt lookup strategies.")] = True,
    ks: Annotated[str, typer.Option("--k", help="Fixed k values to sweep, comma-separated.")] = "1,2,4,8",
    adaptive_k: Annotated[Optional[int], typer.Option("--adaptive-k", help="Largest k the adaptive schedule may choose (default: 8 draft model, 64 lookup).")] = None,
    ngram_max: Annotated[int, typer.Option("--ngram-max")] = 3,
    prompt_set: Annotated[str, typer.Option("--set", help=f"Built-in prompts: {', '.join(PROMPT_SETS)}.")] = "default",
    prompts_file: Annotated[Optional[Path], typer.Option("--prompts", help="JSONL prompts (id, text) instead of a built-in set.")] = None,
    only: Annotated[Optional[str], typer.Option("--only", help="Comma-separated prompt ids to run.")] = None,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", help="Tokens per answer (64: short chat answers).")] = 128,
    repeats: Annotated[int, typer.Option("--repeats", help="Interleaved repeats per prompt.")] = 3,
    plain_twice: Annotated[bool, typer.Option("--plain-twice", help="Also time plain decoding a second time, interleaved like the rest: its ratios to the first are this machine's noise, the floor under every other figure.")] = False,
    cold: Annotated[bool, typer.Option("--cold/--warm", help="A fresh decoder per trial, as `specdec run` (default), or one per strategy for all trials.")] = True,
    ctx_size: Annotated[int, typer.Option("-c", "--ctx-size")] = 2048,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (fewer threads stand in for a slower machine).")] = None,
    n_gpu_layers: Annotated[int, typer.Option("-ngl", "--n-gpu-layers")] = 0,
    draft_n_gpu_layers: Annotated[int, typer.Option("-ngld", "--n-gpu-layers-draft", "--draft-n-gpu-layers")] = 0,
    peer: Annotated[Optional[list[str]], typer.Option("--peer", help="Add another implementation: llama-cpp-python, llama.cpp (repeatable).")] = None,
    peer_bin: Annotated[Optional[Path], typer.Option("--peer-bin", help="llama.cpp's llama-speculative-simple (default: on PATH).")] = None,
    profile_cache: Annotated[bool, typer.Option("--profile-cache/--no-profile-cache", help="Read/write cost profiles and remembered drafter calibrations in the user cache (else every decoder measures and learns afresh).")] = True,
    exact: Annotated[bool, typer.Option("--exact", help="Target in exact mode: fail unless batched passes are bit-identical to one-token passes (docs/exactness.md); --peer llama.cpp runs with the same settings.")] = False,
    exact_warn: Annotated[bool, typer.Option("--exact-warn", help="Target in exact mode, only warn when it is not bit-invariant.")] = False,
    target_python: Annotated[Optional[Path], typer.Option("--target-python", help="Run the target in this interpreter (e.g. an exact llama.cpp build).")] = None,
    temp: TempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    seed: SeedOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable results.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose")] = False,
) -> None:
    """Measure plain decoding against speculative strategies (and other implementations) on the same prompts."""
    try:
        k_values = [int(k) for k in ks.split(",") if k.strip()]
    except ValueError:
        raise ConfigError(f"--k {ks!r} must be comma-separated integers") from None
    if any(k < 1 for k in k_values) or repeats < 1 or max_tokens < 1:
        raise ConfigError(f"--k values ({ks}), --repeats ({repeats}) and -n ({max_tokens}) must be >= 1")
    peers = list(peer or [])
    for p in peers:
        if p not in PEERS:
            raise ConfigError(f"--peer {p!r} must be one of {list(PEERS)}")
    # Every strategy samples with these (sampled outputs are not compared with plain decoding's);
    # the peers decode greedily only.
    sampling = sampling_params(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    if peers and not sampling.greedy:
        raise ConfigError(f"--peer runs greedy decoding only; drop it or --temp {temp}")
    prompts = chosen_prompts(prompt_set, prompts_file)
    if only:
        wanted = only.split(",")
        prompts = [p for p in prompts if p[0] in wanted]
        if not prompts:
            raise ConfigError(f"--only {only!r} matches no prompt id")
    binary = None
    if "llama.cpp" in peers:
        from specdec_gguf.peers import find_llama_speculative

        binary = find_llama_speculative(peer_bin)  # (refused before any model loads when it is missing)
    target = open_engine(EngineSettings(model=model, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers,
                                        exact=exact_flag(exact, exact_warn) or False, python=target_python),
                         verbose=verbose)
    report_exactness(target, "target")
    exactness = exactness_json(("target", target))
    attention = attention_json(("target", target))
    llama_peers = []
    if binary is not None:
        from specdec_gguf.peers import NGRAM_MODES, LlamaCppPeer

        # llama.cpp with our target's settings: exact mode's, and flash attention as "auto" chose it here.
        exact_peer = bool(exact or exact_warn)
        chosen = target.attention
        same = dict(threads=threads, n_ctx=ctx_size, exact=exact_peer,
                    flash_attn=chosen.flash_attn if chosen is not None else None)
        if prompt_lookup:
            llama_peers += [LlamaCppPeer(binary, model, mode, **same) for mode in NGRAM_MODES]
        if draft_model:
            llama_peers.append(LlamaCppPeer(binary, model, "draft-simple", draft=draft_model, draft_max=adaptive_k or 8,
                                            **same))
    draft = None
    try:
        if draft_model:
            draft = open_engine(EngineSettings(model=draft_model, n_ctx=ctx_size, n_threads=threads,
                                               n_gpu_layers=draft_n_gpu_layers), verbose=verbose)
        strategies = strategies_for(draft is not None, prompt_lookup, k_values, adaptive_k, ngram_max, plain_twice)
        tokenized = [(pid, target.tokenize(text)) for pid, text in prompts]
        profile = profile_for(target, use_cache=profile_cache)
        progress = err_console if not json_out else None
        trials = run_trials(target, draft, strategies, tokenized, max_tokens, repeats, sampling, cold=cold,
                            profile_cache=profile_cache,
                            on_trial=(lambda t: progress.print(f"  {t.prompt_id:<16} {t.strategy:<22} "
                                                               f"{t.throughput:7.1f} tok/s", highlight=False, markup=False))
                            if progress else None)
    finally:
        for engine in (draft, target):
            if engine is not None:
                engine.close()
    texts = dict(prompts)
    if "llama-cpp-python" in peers:
        from specdec_gguf.engines.llama_cpp.peer import PeerPromptLookup

        peer_engine = PeerPromptLookup(model, n_ctx=ctx_size, n_threads=threads)
        try:
            peer_engine.generate(tokenized[0][1], min(16, max_tokens))  # warm-up
            trials += run_peer_trials(PEER_NAME, lambda pid, toks: peer_engine.generate(toks, max_tokens)[1],
                                      tokenized, repeats)
        finally:
            peer_engine.close()
        strategies.append(peer_strategy())
    for p in llama_peers:
        trials += run_peer_trials(p.name, lambda pid, toks, p=p: p.run(texts[pid], max_tokens).throughput,
                                  tokenized, repeats)
        strategies.append(peer_strategy(p.name))
    reports = summarize(trials, strategies, greedy=sampling.greedy)
    curve = profile.ratios() if profile else {}
    if json_out:
        print(json.dumps({"reports": [dataclasses.asdict(r) for r in reports], "cost_ratios": curve,
                          "prompts": [p[0] for p in prompts], "max_tokens": max_tokens, "repeats": repeats,
                          "cold": cold, "threads": threads, "exactness": exactness, "attention": attention,
                          "sampling": dataclasses.asdict(sampling)}))
        return
    console = Console(highlight=False, width=None if stdout_is_tty() else 200)
    console.print(render_reports(reports, cold, sampling))
    console.print(per_prompt_table(reports))
    if curve:
        console.print("verify cost vs one-token pass (profile): " + ", ".join(
            f"{n}: {r:.2f}x" for n, r in sorted(curve.items())))
    for r in reports:
        if r.name.startswith("lookup adaptive") or r.name.startswith("draft adaptive"):
            peers_of_kind = [x for x in reports if x.peer]
            for x in peers_of_kind:
                ratios = [r.per_prompt_speedup[p] / x.per_prompt_speedup[p] for p in r.per_prompt_speedup
                          if x.per_prompt_speedup.get(p)]
                if ratios:
                    console.print(f"{r.name} / {x.name}: {geomean(ratios):.2f}x (geomean over prompts)")
    for line in speedup_chart(reports):
        console.print(line)
