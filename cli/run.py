"""`specdec run`: generate once from a prompt, with the live view, plain text or JSON."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from specdec_gguf import ConfigError, SamplingParams
from specdec_gguf.config import DrafterSettings, EngineSettings, load_batch_config
from specdec_gguf.factory import make_decoder, open_engine

from .common import err_console, handle_errors, stdout_is_tty
from .live import LiveState, state_json, summary_lines
from .stream import Interrupted, generate_into


def _given(**values: object) -> dict[str, object]:
    """The flags the user gave (typer passes None for the rest): they win over the config file."""
    return {k: v for k, v in values.items() if v is not None}


def _engine_settings(base: EngineSettings | None, model: Path, **flags: object) -> EngineSettings:
    """One engine's settings: flags over the config's table over the defaults (EngineSettings validates)."""
    given = _given(**flags)
    return dataclasses.replace(base, model=model, **given) if base else EngineSettings(model=model, **given)


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise ConfigError("give the prompt either with -p/--prompt or with -f/--prompt-file, not both")
    if prompt_file is not None:
        try:
            return prompt_file.read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"--prompt-file {prompt_file}: cannot be read ({err.strerror or err})") from None
    if prompt == "-":
        return sys.stdin.read()
    if prompt is None:
        raise ConfigError("no prompt: pass -p TEXT, -p - (stdin) or -f FILE")
    return prompt


MODEL, DRAFTER, SAMPLING, PLACEMENT, OUTPUT = "Model", "Drafter", "Sampling", "Placement", "Prompt and output"


@handle_errors
def run(
    model: Annotated[Optional[Path], typer.Option("-m", "--model", help="Target GGUF model.", rich_help_panel=MODEL)] = None,
    draft_model: Annotated[Optional[Path], typer.Option("-md", "--draft-model", "--model-draft", help="Draft GGUF model.", rich_help_panel=MODEL)] = None,
    ctx_size: Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="Context size (both models unless -cd).", rich_help_panel=MODEL)] = None,
    ctx_size_draft: Annotated[Optional[int], typer.Option("-cd", "--ctx-size-draft", help="Context size of the draft model.", rich_help_panel=MODEL)] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML config with [target], [draft], [drafter], [sampling].", rich_help_panel=MODEL)] = None,
    prompt_lookup: Annotated[bool, typer.Option("--prompt-lookup", help="Draft by n-gram lookup (no draft model).", rich_help_panel=DRAFTER)] = False,
    num_draft_tokens: Annotated[Optional[int], typer.Option("-k", "--num-draft-tokens", "--draft-max", help="Tokens drafted per round; the most, when adaptive (default: 4 fixed; 8 adaptive draft model, 16 adaptive lookup).", rich_help_panel=DRAFTER)] = None,
    draft_min: Annotated[Optional[int], typer.Option("--draft-min", help="Don't verify proposals shorter than this (a plain step instead).", rich_help_panel=DRAFTER)] = None,
    adaptive: Annotated[Optional[bool], typer.Option("--adaptive/--fixed-k", help="Choose k per round from measured cost and acceptance (default) or always draft k.", rich_help_panel=DRAFTER)] = None,
    draft_p_min: Annotated[Optional[float], typer.Option("--draft-p-min", help="Stop a draft when the draft's top probability falls below this.", rich_help_panel=DRAFTER)] = None,
    ngram_max: Annotated[Optional[int], typer.Option("--ngram-max", help="Longest n-gram prompt lookup matches.", rich_help_panel=DRAFTER)] = None,
    ngram_min: Annotated[Optional[int], typer.Option("--ngram-min", help="Shortest n-gram prompt lookup matches.", rich_help_panel=DRAFTER)] = None,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", "--n-predict", help="Tokens to generate at most.", rich_help_panel=SAMPLING)] = None,
    temp: Annotated[Optional[float], typer.Option("--temp", help="Temperature; 0 is greedy.", rich_help_panel=SAMPLING)] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens (0: off).", rich_help_panel=SAMPLING)] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass (1: off).", rich_help_panel=SAMPLING)] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p", help="Drop tokens below this share of the top one (0: off).", rich_help_panel=SAMPLING)] = None,
    seed: Annotated[Optional[int], typer.Option("-s", "--seed", help="Sampling seed.", rich_help_panel=SAMPLING)] = None,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (both models unless -td).", rich_help_panel=PLACEMENT)] = None,
    threads_draft: Annotated[Optional[int], typer.Option("-td", "--threads-draft", help="CPU threads of the draft model.", rich_help_panel=PLACEMENT)] = None,
    n_gpu_layers: Annotated[Optional[int], typer.Option("-ngl", "--n-gpu-layers", "--gpu-layers", help="Target layers on the GPU.", rich_help_panel=PLACEMENT)] = None,
    draft_n_gpu_layers: Annotated[Optional[int], typer.Option("-ngld", "--n-gpu-layers-draft", "--draft-n-gpu-layers", help="Draft layers on the GPU.", rich_help_panel=PLACEMENT)] = None,
    device: Annotated[Optional[str], typer.Option("-dev", "--device", help="ggml devices for the target, comma-separated (see `specdec backends`).", rich_help_panel=PLACEMENT)] = None,
    device_draft: Annotated[Optional[str], typer.Option("-devd", "--device-draft", help="ggml devices for the draft model.", rich_help_panel=PLACEMENT)] = None,
    target_python: Annotated[Optional[Path], typer.Option("--target-python", help="Run the target in this interpreter (another llama.cpp build).", rich_help_panel=PLACEMENT)] = None,
    draft_python: Annotated[Optional[Path], typer.Option("--draft-python", help="Run the draft in this interpreter.", rich_help_panel=PLACEMENT)] = None,
    rpc: Annotated[Optional[str], typer.Option("--rpc", help="llama.cpp RPC servers for the target, comma-separated host:port (GGML_RPC builds).", rich_help_panel=PLACEMENT)] = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="Prompt text; '-' reads stdin.", rich_help_panel=OUTPUT)] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("-f", "--prompt-file", "--file", help="Read the prompt from a file.", rich_help_panel=OUTPUT)] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template.", rich_help_panel=OUTPUT)] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object with text, tokens and stats.", rich_help_panel=OUTPUT)] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="Stream plain text instead of the live view.", rich_help_panel=OUTPUT)] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="llama.cpp logs and full tracebacks.", rich_help_panel=OUTPUT)] = False,
) -> None:
    """Generate from a prompt with speculative decoding (plain decoding without a drafter)."""
    cfg = load_batch_config(config, require_prompts=False) if config else None
    cfg_target = cfg.target if cfg else None
    cfg_draft = cfg.draft if cfg else None
    cfg_run = cfg.runs[0] if cfg else None
    model = model or (cfg_target.model if cfg_target else None)
    if model is None:
        raise ConfigError("no target model: pass -m/--model or --config with a [target] table")
    target_settings = _engine_settings(
        cfg_target, model, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers, python=target_python,
        rpc_servers=rpc.split(",") if rpc else None, devices=device.split(",") if device else None)
    draft_path = draft_model or (cfg_draft.model if cfg_draft else None)
    draft_settings = None
    if draft_path is not None:
        # The draft follows the target's context size and threads unless told otherwise.
        draft_ctx = ctx_size_draft or ctx_size or (None if cfg_draft else target_settings.n_ctx)
        draft_settings = _engine_settings(
            cfg_draft, draft_path, n_ctx=draft_ctx, n_threads=threads_draft or threads,
            n_gpu_layers=draft_n_gpu_layers, python=draft_python, devices=device_draft.split(",") if device_draft else None)
    base = cfg_run.drafter if cfg_run else DrafterSettings()
    if prompt_lookup and draft_model is not None:
        raise ConfigError("choose one drafter: -md/--draft-model or --prompt-lookup, not both")
    kind = "prompt-lookup" if prompt_lookup else "draft-model" if draft_model is not None else base.kind
    if kind == "none" and draft_settings is not None and cfg_run is None:
        kind = "draft-model"
    drafter = dataclasses.replace(base, kind=kind, **_given(
        num_draft_tokens=num_draft_tokens, draft_min=draft_min, adaptive=adaptive, p_min=draft_p_min,
        ngram_max=ngram_max, ngram_min=ngram_min))
    sampling = dataclasses.replace(cfg_run.sampling if cfg_run else SamplingParams(), **_given(
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed))
    n = max_tokens if max_tokens is not None else (cfg_run.max_tokens if cfg_run else 256)
    if n < 1:
        raise ConfigError(f"--max-tokens {n} must be >= 1")
    text = read_prompt(prompt, prompt_file)

    target = open_engine(target_settings, verbose=verbose)
    draft = None
    try:
        if drafter.kind == "draft-model":
            if draft_settings is None:
                raise ConfigError("drafter 'draft-model' needs -md/--draft-model or a [draft] table")
            draft = open_engine(draft_settings, verbose=verbose)
        decoder = make_decoder(target, drafter, draft)
        full_text = target.format_chat(text) if chat else text
        prompt_tokens = target.tokenize(full_text, add_bos=True, special=chat)
        mode = "quiet" if json_out else ("live" if stdout_is_tty() and not no_live else "plain")
        title = {"none": "plain decoding", "draft-model": f"draft model {draft_settings.model.name if draft_settings else ''}",
                 "prompt-lookup": "prompt lookup"}[drafter.kind]
        state = LiveState(title=f"{target_settings.model.name} · {title}")
        try:
            tokens = generate_into(state, decoder, target, prompt_tokens, n, sampling, mode)
        except Interrupted as stop:
            _report(stop.state, stop.tokens, mode, json_out, target_settings, draft_settings, drafter, sampling, n)
            raise typer.Exit(130) from None
        _report(state, tokens, mode, json_out, target_settings, draft_settings, drafter, sampling, n)
    finally:
        for engine in (draft, target):
            if engine is not None:
                engine.close()


def _report(state: LiveState, tokens: list[int], mode: str, json_out: bool, target_settings: EngineSettings,
            draft_settings: EngineSettings | None, drafter: DrafterSettings, sampling: SamplingParams,
            max_tokens: int) -> None:
    if json_out:
        settings = {"target": target_settings, "draft": draft_settings, "drafter": drafter.resolved(),
                    "sampling": sampling, "max_tokens": max_tokens}
        resolved = json.loads(json.dumps({k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                                          for k, v in settings.items()}, default=str))
        print(json.dumps(state_json(state, tokens, resolved), ensure_ascii=False))
        return
    if mode == "plain" and state.stop_reason == "interrupted":
        print()
    for line in summary_lines(state.stats, state.stop_reason):
        (err_console if mode == "plain" else Console()).print(line, highlight=False, soft_wrap=True)

