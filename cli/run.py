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

from .common import attention_json, err_console, exactness_json, handle_errors, stdout_is_tty
from .options import (CHAT, OUTPUT, ChatTemplateOpt, loaded_models, ModelSettings,
                      ProfileCacheOpt, VerboseOpt, with_model_settings)
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
@with_model_settings
def run(
    settings: ModelSettings,
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
    n = settings.max_tokens if settings.max_tokens is not None else 256
    text = read_prompt(prompt, prompt_file)
    chat = chat or system is not None or chat_template is not None
    stop_strings = check_stop_strings(stop, "--stop") if stop else settings.stop

    with loaded_models(settings, verbose=verbose) as (target, draft):
        # For --json: exact mode's self-tests, and flash attention where "auto" timed it.
        verdicts = {"exactness": exactness_json(("target", target), ("draft", draft)),
                    "attention": attention_json(("target", target), ("draft", draft))}
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
            max_tokens: int, engines: dict) -> None:
    if json_out:
        settings = {"target": model_settings.target, "draft": model_settings.draft,
                    "drafter": model_settings.drafter.resolved(), "sampling": model_settings.sampling,
                    "max_tokens": max_tokens}
        resolved = json.loads(json.dumps({k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                                          for k, v in settings.items()}, default=str))
        print(json.dumps({**state_json(state, tokens, resolved), **engines}, ensure_ascii=False))
        return
    if mode == "plain" and state.stop_reason == "interrupted":
        print()
    for line in summary_lines(state.stats, state.stop_reason, state.drafting):
        (err_console if mode == "plain" else Console()).print(line, highlight=False, soft_wrap=True)

