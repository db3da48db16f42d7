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


def _pick(flag, config_value, default):
    """A flag the user gave wins over the config file, which wins over the default."""
    if flag is not None:
        return flag
    return default if config_value is None else config_value


def _engine_settings(base: EngineSettings | None, model: Path, n_ctx: int | None, n_ctx_default: int,
                     threads: int | None, n_gpu_layers: int | None, python: Path | None,
                     rpc_servers: list[str] | None = None) -> EngineSettings:
    """One engine's settings: flags over the config's table over the defaults."""
    def cfg(name: str):
        return getattr(base, name) if base is not None else None

    return dataclasses.replace(
        base or EngineSettings(model=model), model=model, n_ctx=_pick(n_ctx, cfg("n_ctx"), n_ctx_default),
        n_threads=_pick(threads, cfg("n_threads"), None), n_gpu_layers=_pick(n_gpu_layers, cfg("n_gpu_layers"), 0),
        python=_pick(python, cfg("python"), None), rpc_servers=_pick(rpc_servers, cfg("rpc_servers"), None))


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


@handle_errors
def run(
    model: Annotated[Optional[Path], typer.Option("-m", "--model", help="Target GGUF model.")] = None,
    draft_model: Annotated[Optional[Path], typer.Option("-md", "--draft-model", help="Draft GGUF model.")] = None,
    prompt_lookup: Annotated[bool, typer.Option("--prompt-lookup", help="Draft by n-gram lookup (no draft model).")] = False,
    num_draft_tokens: Annotated[Optional[int], typer.Option("-k", "--num-draft-tokens", help="Tokens drafted per round; the most, when adaptive (default: 4 fixed; 8 adaptive draft model, 16 adaptive lookup).")] = None,
    adaptive: Annotated[Optional[bool], typer.Option("--adaptive/--fixed-k", help="Choose k per round from measured cost and acceptance (default) or always draft k.")] = None,
    draft_p_min: Annotated[Optional[float], typer.Option("--draft-p-min", help="Stop a draft when the draft's top probability falls below this.")] = None,
    ngram_max: Annotated[Optional[int], typer.Option("--ngram-max", help="Longest n-gram prompt lookup matches.")] = None,
    ngram_min: Annotated[Optional[int], typer.Option("--ngram-min", help="Shortest n-gram prompt lookup matches.")] = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="Prompt text; '-' reads stdin.")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("-f", "--prompt-file", help="Read the prompt from a file.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the model's chat template.")] = False,
    max_tokens: Annotated[Optional[int], typer.Option("-n", "--max-tokens", help="Tokens to generate at most.")] = None,
    temp: Annotated[Optional[float], typer.Option("--temp", help="Temperature; 0 is greedy.")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens (0: off).")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass (1: off).")] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p", help="Drop tokens below this share of the top one (0: off).")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Sampling seed.")] = None,
    ctx_size: Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="Context size of both models.")] = None,
    threads: Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads per model.")] = None,
    n_gpu_layers: Annotated[Optional[int], typer.Option("-ngl", "--n-gpu-layers", help="Target layers on the GPU.")] = None,
    draft_n_gpu_layers: Annotated[Optional[int], typer.Option("-ngld", "--draft-n-gpu-layers", help="Draft layers on the GPU.")] = None,
    target_python: Annotated[Optional[Path], typer.Option("--target-python", help="Run the target in this interpreter (another llama.cpp build).")] = None,
    draft_python: Annotated[Optional[Path], typer.Option("--draft-python", help="Run the draft in this interpreter.")] = None,
    rpc: Annotated[Optional[str], typer.Option("--rpc", help="llama.cpp RPC servers for the target, comma-separated host:port (GGML_RPC builds).")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="TOML config with [target], [draft], [drafter], [sampling].")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object with text, tokens and stats.")] = False,
    no_live: Annotated[bool, typer.Option("--no-live", help="Stream plain text instead of the live view.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="llama.cpp logs and full tracebacks.")] = False,
) -> None:
    """Generate from a prompt with speculative decoding (plain decoding without a drafter)."""
    cfg = load_batch_config(config, require_prompts=False) if config else None
    cfg_target = cfg.target if cfg else None
    cfg_draft = cfg.draft if cfg else None
    cfg_run = cfg.runs[0] if cfg else None
    model = _pick(model, cfg_target and cfg_target.model, None)
    if model is None:
        raise ConfigError("no target model: pass -m/--model or --config with a [target] table")
    target_settings = _engine_settings(
        cfg_target, model, ctx_size, 4096, threads, n_gpu_layers, target_python, rpc.split(",") if rpc else None)
    draft_path = _pick(draft_model, cfg_draft and cfg_draft.model, None)
    draft_settings = None
    if draft_path is not None:
        draft_settings = _engine_settings(cfg_draft, draft_path, ctx_size, target_settings.n_ctx, threads,
                                          draft_n_gpu_layers, draft_python)
    base = cfg_run.drafter if cfg_run else DrafterSettings()
    if prompt_lookup and draft_model is not None:
        raise ConfigError("choose one drafter: -md/--draft-model or --prompt-lookup, not both")
    kind = "prompt-lookup" if prompt_lookup else "draft-model" if draft_model is not None else base.kind
    if kind == "none" and draft_settings is not None and cfg_run is None:
        kind = "draft-model"
    is_adaptive = _pick(adaptive, cfg_run and base.adaptive, True)
    # k is an upper bound when adaptive: allow long drafts (lookup drafts cost nothing to make).
    default_k = 4 if not is_adaptive else (16 if kind == "prompt-lookup" else 8)
    drafter = DrafterSettings(
        kind=kind, num_draft_tokens=_pick(num_draft_tokens, cfg_run and base.num_draft_tokens, default_k),
        adaptive=is_adaptive,
        p_min=_pick(draft_p_min, cfg_run and base.p_min, 0.0),
        ngram_max=_pick(ngram_max, cfg_run and base.ngram_max, 3),
        ngram_min=_pick(ngram_min, cfg_run and base.ngram_min, 1))
    s = cfg_run.sampling if cfg_run else SamplingParams()
    sampling = SamplingParams(temperature=_pick(temp, s.temperature, 0.0), top_k=_pick(top_k, s.top_k, 0),
                              top_p=_pick(top_p, s.top_p, 1.0), min_p=_pick(min_p, s.min_p, 0.0),
                              seed=_pick(seed, s.seed, None))
    n = _pick(max_tokens, cfg_run and cfg_run.max_tokens, 256)
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
        settings = {"target": target_settings, "draft": draft_settings, "drafter": drafter,
                    "sampling": sampling, "max_tokens": max_tokens}
        resolved = json.loads(json.dumps({k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                                          for k, v in settings.items()}, default=str))
        print(json.dumps(state_json(state, tokens, resolved), ensure_ascii=False))
        return
    if mode == "plain" and state.stop_reason == "interrupted":
        print()
    for line in summary_lines(state.stats, state.stop_reason):
        (err_console if mode == "plain" else Console()).print(line, highlight=False, soft_wrap=True)

