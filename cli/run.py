"""`specdec run`: generate once from a prompt, with the live view, plain text or JSON."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specdec_gguf import ConfigError
from specdec_gguf.chat import chat_prompt_tokens, end_of_turn_tokens, load_chat_template, require_template
from specdec_gguf.factory import make_decoder
from specdec_gguf.stopping import check_stop_strings
from specdec_gguf.textfiles import check_unicode, decode_utf8, read_text

from .common import err_console, exactness_json, handle_errors, stdout_is_tty
from .options import (CHAT, OUTPUT, AdaptiveOpt, ChatTemplateOpt, ConfigOpt, CtxSizeDraftOpt, CtxSizeOpt,
                      DeviceDraftOpt, DeviceOpt, DraftMinOpt, DraftModelOpt, DraftNGpuLayersOpt, DraftPMinOpt,
                      DraftPythonOpt, ExactOpt, ExactWarnOpt, loaded_models, MaxTokensOpt, MinPOpt, ModelOpt,
                      ModelSettings, NGpuLayersOpt, NgramMaxOpt, NgramMinOpt, NumDraftOpt, ProfileCacheOpt,
                      PromptLookupOpt, resolve_settings, RpcOpt, SeedOpt, TargetPythonOpt, TempOpt, ThreadsDraftOpt,
                      ThreadsOpt, TopKOpt, TopPOpt, VerboseOpt)
from .live import LiveState, state_json, summary_lines
from .stream import Interrupted, generate_into


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise ConfigError("give the prompt either with -p/--prompt or with -f/--prompt-file, not both")
    if prompt_file is not None:
        return read_text(prompt_file, f"--prompt-file {prompt_file}")
    if prompt == "-":
        return decode_utf8(sys.stdin.buffer.read(), "stdin")
    if prompt is None:
        raise ConfigError("no prompt: pass -p TEXT, -p - (stdin) or -f FILE")
    return check_unicode(prompt, "-p/--prompt")  # undecodable argv bytes arrive as lone surrogates


@handle_errors
def run(
    model: ModelOpt = None,
    draft_model: DraftModelOpt = None,
    ctx_size: CtxSizeOpt = None,
    ctx_size_draft: CtxSizeDraftOpt = None,
    config: ConfigOpt = None,
    prompt_lookup: PromptLookupOpt = False,
    num_draft_tokens: NumDraftOpt = None,
    draft_min: DraftMinOpt = None,
    adaptive: AdaptiveOpt = None,
    draft_p_min: DraftPMinOpt = None,
    ngram_max: NgramMaxOpt = None,
    ngram_min: NgramMinOpt = None,
    max_tokens: MaxTokensOpt = None,
    temp: TempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    seed: SeedOpt = None,
    threads: ThreadsOpt = None,
    threads_draft: ThreadsDraftOpt = None,
    n_gpu_layers: NGpuLayersOpt = None,
    draft_n_gpu_layers: DraftNGpuLayersOpt = None,
    device: DeviceOpt = None,
    device_draft: DeviceDraftOpt = None,
    target_python: TargetPythonOpt = None,
    draft_python: DraftPythonOpt = None,
    rpc: RpcOpt = None,
    exact: ExactOpt = False,
    exact_warn: ExactWarnOpt = False,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="Prompt text; '-' reads stdin.", rich_help_panel=OUTPUT)] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("-f", "--prompt-file", "--file", help="Read the prompt from a file.", rich_help_panel=OUTPUT)] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Send the prompt as a user turn through the chat template.", rich_help_panel=CHAT)] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="A system turn before the prompt (implies --chat).", rich_help_panel=CHAT)] = None,
    chat_template: ChatTemplateOpt = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop where this text appears (repeatable); the text ends before it.", rich_help_panel=OUTPUT)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object with text, tokens and stats.", rich_help_panel=OUTPUT)] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="Stream plain text instead of the live view.", rich_help_panel=OUTPUT)] = False,
    profile_cache: ProfileCacheOpt = True,
    verbose: VerboseOpt = False,
) -> None:
    """Generate from a prompt with speculative decoding (plain decoding without a drafter)."""
    settings = resolve_settings(
        config=config, model=model, draft_model=draft_model, ctx_size=ctx_size, ctx_size_draft=ctx_size_draft,
        prompt_lookup=prompt_lookup, num_draft_tokens=num_draft_tokens, draft_min=draft_min, adaptive=adaptive,
        draft_p_min=draft_p_min, ngram_max=ngram_max, ngram_min=ngram_min, max_tokens=max_tokens, temp=temp,
        top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, threads=threads, threads_draft=threads_draft,
        n_gpu_layers=n_gpu_layers, draft_n_gpu_layers=draft_n_gpu_layers, device=device, device_draft=device_draft,
        target_python=target_python, draft_python=draft_python, rpc=rpc, exact=exact, exact_warn=exact_warn)
    n = settings.max_tokens if settings.max_tokens is not None else 256
    text = read_prompt(prompt, prompt_file)
    chat = chat or system is not None or chat_template is not None
    stop_strings = check_stop_strings(stop, "--stop") if stop else settings.stop

    with loaded_models(settings, verbose=verbose) as (target, draft):
        verdicts = exactness_json(("target", target), ("draft", draft))  # exact mode's self-tests, for --json
        decoder = make_decoder(target, settings.drafter, draft, profile_cache=profile_cache)
        stop_ids: frozenset[int] = frozenset()
        if chat:
            formatter = require_template(load_chat_template(target, chat_template), target)
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [
                {"role": "user", "content": text}]
            prompt_tokens = chat_prompt_tokens(target, formatter.render(messages))
            stop_ids = end_of_turn_tokens(formatter, target)
        else:
            prompt_tokens = target.tokenize(text, add_bos=True)
        mode = "quiet" if json_out else ("live" if stdout_is_tty() and not no_live else "plain")
        title = {"none": "plain decoding", "draft-model": f"draft model {settings.draft.model.name if settings.draft else ''}",
                 "prompt-lookup": "prompt lookup"}[settings.drafter.kind]
        state = LiveState(title=f"{settings.target.model.name} · {title}", drafting=settings.drafter.kind != "none")
        try:
            tokens = generate_into(state, decoder, target, prompt_tokens, n, settings.sampling, mode,
                                   stop_token_ids=stop_ids, stop=stop_strings)
        except Interrupted as stop:
            _report(stop.state, stop.tokens, mode, json_out, settings, n, verdicts)
            raise typer.Exit(130) from None
        _report(state, tokens, mode, json_out, settings, n, verdicts)


def _report(state: LiveState, tokens: list[int], mode: str, json_out: bool, model_settings: ModelSettings,
            max_tokens: int, exactness: dict) -> None:
    if json_out:
        settings = {"target": model_settings.target, "draft": model_settings.draft,
                    "drafter": model_settings.drafter.resolved(), "sampling": model_settings.sampling,
                    "max_tokens": max_tokens}
        resolved = json.loads(json.dumps({k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                                          for k, v in settings.items()}, default=str))
        print(json.dumps({**state_json(state, tokens, resolved), "exactness": exactness}, ensure_ascii=False))
        return
    if mode == "plain" and state.stop_reason == "interrupted":
        print()
    for line in summary_lines(state.stats, state.stop_reason, state.drafting):
        (err_console if mode == "plain" else Console()).print(line, highlight=False, soft_wrap=True)

