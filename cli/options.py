"""The model, drafter, sampling and placement flags `run` and `serve` share, and how they become settings
(``with_model_settings`` gives a command those flags and hands it the settings).

Flags win over a ``--config`` file's tables, which win over the defaults in
``specdec_gguf.settings``; validation happens there, once.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import typer

from specdec_gguf import ConfigError, SamplingParams
from specdec_gguf.config import load_batch_config
from specdec_gguf.engine import TextModel
from specdec_gguf.factory import open_engine
from specdec_gguf.settings import DrafterSettings, EngineSettings

from .common import exact_flag, report_exactness

MODEL, DRAFTER, SAMPLING, PLACEMENT, OUTPUT, CHAT = (
    "Model", "Drafter", "Sampling", "Placement", "Prompt and output", "Chat")

ModelOpt = Annotated[Optional[Path], typer.Option("-m", "--model", help="Target GGUF model.", rich_help_panel=MODEL)]
DraftModelOpt = Annotated[Optional[Path], typer.Option("-md", "--draft-model", "--model-draft", help="Draft GGUF model.", rich_help_panel=MODEL)]
CtxSizeOpt = Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="Context size (both models unless -cd).", rich_help_panel=MODEL)]
CtxSizeDraftOpt = Annotated[Optional[int], typer.Option("-cd", "--ctx-size-draft", help="Context size of the draft model.", rich_help_panel=MODEL)]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="TOML config with \\[target], \\[draft], \\[drafter], \\[sampling] tables.", rich_help_panel=MODEL)]
PromptLookupOpt = Annotated[bool, typer.Option("--prompt-lookup", help="Draft by n-gram lookup (no draft model).", rich_help_panel=DRAFTER)]
NumDraftOpt = Annotated[Optional[int], typer.Option("-k", "--num-draft-tokens", "--draft-max", help="Tokens drafted per round; the most, when adaptive (default: 4 fixed; 8 adaptive draft model, 64 adaptive lookup).", rich_help_panel=DRAFTER)]
DraftMinOpt = Annotated[Optional[int], typer.Option("--draft-min", help="Don't verify proposals shorter than this (a plain step instead; not a draft model's sampled ones, which are verified whole).", rich_help_panel=DRAFTER)]
AdaptiveOpt = Annotated[Optional[bool], typer.Option("--adaptive/--fixed-k", help="Choose k per round from measured cost and acceptance (default) or always draft k.", rich_help_panel=DRAFTER)]
DraftPMinOpt = Annotated[Optional[float], typer.Option("--draft-p-min", help="Stop a draft when the draft's top probability falls below this.", rich_help_panel=DRAFTER)]
NgramMaxOpt = Annotated[Optional[int], typer.Option("--ngram-max", help="Longest n-gram prompt lookup matches.", rich_help_panel=DRAFTER)]
ProfileCacheOpt = Annotated[bool, typer.Option("--profile-cache/--no-profile-cache", help="Read/write cost profiles and remembered drafter calibrations in the user cache (else measure and learn each run).", rich_help_panel=DRAFTER)]
NgramMinOpt = Annotated[Optional[int], typer.Option("--ngram-min", help="Shortest n-gram prompt lookup matches.", rich_help_panel=DRAFTER)]
MaxTokensOpt = Annotated[Optional[int], typer.Option("-n", "--max-tokens", "--n-predict", help="Tokens to generate at most.", rich_help_panel=SAMPLING)]
TempOpt = Annotated[Optional[float], typer.Option("--temp", help="Temperature; 0 is greedy.", rich_help_panel=SAMPLING)]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens (0: off).", rich_help_panel=SAMPLING)]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling mass (1: off).", rich_help_panel=SAMPLING)]
MinPOpt = Annotated[Optional[float], typer.Option("--min-p", help="Drop tokens below this share of the top one (0: off).", rich_help_panel=SAMPLING)]
SeedOpt = Annotated[Optional[int], typer.Option("-s", "--seed", help="Sampling seed.", rich_help_panel=SAMPLING)]
ThreadsOpt = Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (both models unless -td).", rich_help_panel=PLACEMENT)]
ThreadsDraftOpt = Annotated[Optional[int], typer.Option("-td", "--threads-draft", help="CPU threads of the draft model.", rich_help_panel=PLACEMENT)]
NGpuLayersOpt = Annotated[Optional[int], typer.Option("-ngl", "--n-gpu-layers", "--gpu-layers", help="Target layers on the GPU.", rich_help_panel=PLACEMENT)]
DraftNGpuLayersOpt = Annotated[Optional[int], typer.Option("-ngld", "--n-gpu-layers-draft", "--draft-n-gpu-layers", help="Draft layers on the GPU.", rich_help_panel=PLACEMENT)]
DeviceOpt = Annotated[Optional[str], typer.Option("-dev", "--device", help="ggml devices for the target, comma-separated (see `specdec backends`).", rich_help_panel=PLACEMENT)]
DeviceDraftOpt = Annotated[Optional[str], typer.Option("-devd", "--device-draft", help="ggml devices for the draft model.", rich_help_panel=PLACEMENT)]
# Interpreters are strings, not Paths: Path("./py") prints as "py", which would be looked up on PATH.
TargetPythonOpt = Annotated[Optional[str], typer.Option("--target-python", help="Run the target in this interpreter (another llama.cpp build); a path, or a name looked up on PATH.", rich_help_panel=PLACEMENT)]
DraftPythonOpt = Annotated[Optional[str], typer.Option("--draft-python", help="Run the draft in this interpreter.", rich_help_panel=PLACEMENT)]
RpcOpt = Annotated[Optional[str], typer.Option("--rpc", help="llama.cpp RPC servers for the target, comma-separated host:port (GGML_RPC builds).", rich_help_panel=PLACEMENT)]
FlashAttnOpt = Annotated[Optional[str], typer.Option("-fa", "--flash-attn", help="Flash attention for both models: auto (on a CPU: timed on and off once, off where clearly faster; cached), on, off.", rich_help_panel=PLACEMENT)]
ExactOpt = Annotated[bool, typer.Option("--exact", help="Exact mode for the target: batch-invariant settings and a self-test at load; an error unless greedy output will be bit-identical to plain decoding (docs/exactness.md).", rich_help_panel=MODEL)]
ExactWarnOpt = Annotated[bool, typer.Option("--exact-warn", help="Exact mode, but only warn when the self-test finds this build or model not bit-invariant.", rich_help_panel=MODEL)]
ChatTemplateOpt = Annotated[Optional[str], typer.Option("--chat-template", help="Chat template: a llama.cpp built-in name (chatml, llama3, gemma, ...) or a Jinja file; default: the model file's own.", rich_help_panel=CHAT)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="llama.cpp logs and full tracebacks.", rich_help_panel=OUTPUT)]


def _given(**values: object) -> dict[str, object]:
    """The flags the user gave (typer passes None for the rest): they win over the config file."""
    return {k: v for k, v in values.items() if v is not None}


def sampling_params(*, temp: float | None, top_k: int | None, top_p: float | None, min_p: float | None,
                    seed: int | None, base: SamplingParams | None = None) -> SamplingParams:
    """The sampling flags given, over ``base`` (a config's [sampling] table) or the defaults; validated."""
    return dataclasses.replace(base or SamplingParams(), **_given(
        temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed))


def _engine_settings(base: EngineSettings | None, model: Path, **flags: object) -> EngineSettings:
    """One engine's settings: flags over the config's table over the defaults (EngineSettings validates)."""
    given = _given(**flags)
    return dataclasses.replace(base, model=model, **given) if base else EngineSettings(model=model, **given)


def _split(value: str | None) -> list[str] | None:
    return value.split(",") if value else None


@dataclass(frozen=True)
class ModelSettings:
    """Everything the shared flags decide: both engines, the drafter, sampling defaults and the token limit."""

    target: EngineSettings
    draft: EngineSettings | None
    drafter: DrafterSettings
    sampling: SamplingParams
    max_tokens: int | None  # None: neither a flag nor a config file set one
    stop: tuple[str, ...] = ()  # the config's stop strings (run's --stop replaces them)


def resolve_settings(*, model: ModelOpt = None, draft_model: DraftModelOpt = None, ctx_size: CtxSizeOpt = None,
                     ctx_size_draft: CtxSizeDraftOpt = None, config: ConfigOpt = None,
                     prompt_lookup: PromptLookupOpt = False, num_draft_tokens: NumDraftOpt = None,
                     draft_min: DraftMinOpt = None, adaptive: AdaptiveOpt = None, draft_p_min: DraftPMinOpt = None,
                     ngram_max: NgramMaxOpt = None, ngram_min: NgramMinOpt = None, max_tokens: MaxTokensOpt = None,
                     temp: TempOpt = None, top_k: TopKOpt = None, top_p: TopPOpt = None, min_p: MinPOpt = None,
                     seed: SeedOpt = None, threads: ThreadsOpt = None, threads_draft: ThreadsDraftOpt = None,
                     n_gpu_layers: NGpuLayersOpt = None, draft_n_gpu_layers: DraftNGpuLayersOpt = None,
                     device: DeviceOpt = None, device_draft: DeviceDraftOpt = None,
                     target_python: TargetPythonOpt = None, draft_python: DraftPythonOpt = None, rpc: RpcOpt = None,
                     flash_attn: FlashAttnOpt = None, exact: ExactOpt = False, exact_warn: ExactWarnOpt = False) -> ModelSettings:
    """The shared flags (and ``--config``) as validated settings. Its parameters are the flags `run` and
    `serve` take (``with_model_settings``), in the order their help lists them."""
    cfg = load_batch_config(config, require_prompts=False) if config else None
    cfg_target = cfg.target if cfg else None
    cfg_draft = cfg.draft if cfg else None
    cfg_run = cfg.runs[0] if cfg else None
    model = model or (cfg_target.model if cfg_target else None)
    if model is None:
        raise ConfigError("no target model: pass -m/--model or --config with a [target] table")
    target = _engine_settings(
        cfg_target, model, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers, python=target_python,
        rpc_servers=_split(rpc), devices=_split(device), flash_attn=flash_attn, exact=exact_flag(exact, exact_warn))
    draft_path = draft_model or (cfg_draft.model if cfg_draft else None)
    draft = None
    if draft_path is not None:
        # The draft follows the target's context size and threads unless told otherwise.
        draft_ctx = ctx_size_draft or ctx_size or (None if cfg_draft else target.n_ctx)
        draft = _engine_settings(
            cfg_draft, draft_path, n_ctx=draft_ctx, n_threads=threads_draft or threads,
            n_gpu_layers=draft_n_gpu_layers, python=draft_python, devices=_split(device_draft), flash_attn=flash_attn)
    base = cfg_run.drafter if cfg_run else DrafterSettings()
    if prompt_lookup and draft_model is not None:
        raise ConfigError("choose one drafter: -md/--draft-model or --prompt-lookup, not both")
    kind = "prompt-lookup" if prompt_lookup else "draft-model" if draft_model is not None else base.kind
    if kind == "none" and draft is not None and cfg_run is None:
        kind = "draft-model"
    drafter = dataclasses.replace(base, kind=kind, **_given(
        num_draft_tokens=num_draft_tokens, draft_min=draft_min, adaptive=adaptive, p_min=draft_p_min,
        ngram_max=ngram_max, ngram_min=ngram_min))
    if drafter.kind == "draft-model" and draft is None:
        raise ConfigError("drafter 'draft-model' needs -md/--draft-model or a [draft] table")
    sampling = sampling_params(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                               base=cfg_run.sampling if cfg_run else None)
    n = max_tokens if max_tokens is not None else (cfg_run.max_tokens if cfg_run else None)
    if n is not None and n < 1:
        raise ConfigError(f"--max-tokens {n} must be >= 1")
    return ModelSettings(target=target, draft=draft, drafter=drafter, sampling=sampling, max_tokens=n,
                         stop=cfg_run.stop if cfg_run else ())


def with_model_settings(command: Callable[..., None]) -> Callable[..., None]:
    """A typer command ``command(settings, **own)`` that takes the shared flags (``resolve_settings``'
    parameters, listed first) beside its own, and is called with them resolved as ``settings``."""
    shared = inspect.signature(resolve_settings, eval_str=True).parameters
    own = [p for name, p in inspect.signature(command, eval_str=True).parameters.items() if name != "settings"]
    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in (*shared.values(), *own)]

    @functools.wraps(command)
    def wrapper(**flags: Any) -> None:
        settings = resolve_settings(**{name: flags.pop(name) for name in shared})
        command(settings=settings, **flags)

    # What typer reads: the signature, and the annotations (evaluated: the modules postpone them).
    wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


@contextmanager
def loaded_models(settings: ModelSettings, *, verbose: bool = False) -> Iterator[tuple[TextModel, TextModel | None]]:
    """Load the target (and the draft model when the drafter needs one); close both on the way out."""
    target = open_engine(settings.target, verbose=verbose)
    report_exactness(target, "target")
    draft = None
    try:
        if settings.drafter.kind == "draft-model" and settings.draft is not None:
            draft = open_engine(settings.draft, verbose=verbose)
            report_exactness(draft, "draft")
        yield target, draft
    finally:
        for engine in (draft, target):
            if engine is not None:
                engine.close()
