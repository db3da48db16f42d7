"""`specdec serve`: an OpenAI-compatible HTTP server with speculative decoding."""

from __future__ import annotations

import signal
from typing import Annotated, Optional

import typer

from specdec_gguf import ConfigError
from specdec_gguf.chat import load_chat_template
from specdec_gguf.server import ModelService, run_server

from .common import err_console, handle_errors
from .options import (DRAFTER, AdaptiveOpt, ChatTemplateOpt, ConfigOpt, CtxSizeDraftOpt, CtxSizeOpt, DeviceDraftOpt,
                      DeviceOpt, DraftMinOpt, DraftModelOpt, DraftNGpuLayersOpt, DraftPMinOpt, DraftPythonOpt,
                      ExactOpt, ExactWarnOpt, loaded_models, MaxTokensOpt, MinPOpt, ModelOpt, NGpuLayersOpt,
                      NgramMaxOpt, NgramMinOpt, NumDraftOpt, ProfileCacheOpt, PromptLookupOpt, resolve_settings,
                      RpcOpt, SeedOpt, TargetPythonOpt, TempOpt, ThreadsDraftOpt, ThreadsOpt, TopKOpt, TopPOpt,
                      VerboseOpt)

SERVER = "Server"
DEFAULT_LOOKUP_MEMORY = 32768  # tokens: a few long conversations or agent loops


@handle_errors
def serve(
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
    lookup_memory: Annotated[Optional[int], typer.Option("--lookup-memory", help=f"Prompt lookup also drafts from the last N tokens of earlier requests (0: off; default {DEFAULT_LOOKUP_MEMORY} with --prompt-lookup).", rich_help_panel=DRAFTER)] = None,
    profile_cache: ProfileCacheOpt = True,
    chat_template: ChatTemplateOpt = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.", rich_help_panel=SERVER)] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.", rich_help_panel=SERVER)] = 8080,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="SPECDEC_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1 routes.", rich_help_panel=SERVER)] = None,
    alias: Annotated[Optional[str], typer.Option("-a", "--alias", help="Model id reported by /v1/models (default: the file name).", rich_help_panel=SERVER)] = None,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait while one generates; more get 503.", rich_help_panel=SERVER)] = 16,
    verbose: VerboseOpt = False,
) -> None:
    """Serve the model over the OpenAI HTTP API (chat and text completions, streaming) with speculative decoding.

    Request defaults come from the same flags as `run` (sampling, -n as the default
    max_tokens, draft settings); each request may override them. Ctrl-C stops.
    """
    settings = resolve_settings(
        config=config, model=model, draft_model=draft_model, ctx_size=ctx_size, ctx_size_draft=ctx_size_draft,
        prompt_lookup=prompt_lookup, num_draft_tokens=num_draft_tokens, draft_min=draft_min, adaptive=adaptive,
        draft_p_min=draft_p_min, ngram_max=ngram_max, ngram_min=ngram_min, max_tokens=max_tokens, temp=temp,
        top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, threads=threads, threads_draft=threads_draft,
        n_gpu_layers=n_gpu_layers, draft_n_gpu_layers=draft_n_gpu_layers, device=device, device_draft=device_draft,
        target_python=target_python, draft_python=draft_python, rpc=rpc, exact=exact, exact_warn=exact_warn)
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} must lie in [1, 65535]")
    if lookup_memory is not None and lookup_memory > 0 and settings.drafter.kind != "prompt-lookup":
        raise ConfigError(f"--lookup-memory {lookup_memory} needs --prompt-lookup (it is prompt lookup's memory)")
    if lookup_memory is None:
        lookup_memory = DEFAULT_LOOKUP_MEMORY if settings.drafter.kind == "prompt-lookup" else 0
    with loaded_models(settings, verbose=verbose) as (target, draft):
        formatter = load_chat_template(target, chat_template)
        service = ModelService(target, settings.drafter, draft=draft, model_id=alias or settings.target.model.name,
                               chat_formatter=formatter, sampling=settings.sampling,
                               max_tokens=settings.max_tokens, max_queue=max_queue, lookup_memory=lookup_memory,
                               profile_cache=profile_cache)
        template = formatter.name if formatter else "none (chat requests get a 400; use --chat-template)"
        memory = f" (memory {lookup_memory} tokens)" if lookup_memory else ""
        err_console.print(f"specdec serve: {service.model_id} · drafter {settings.drafter.kind}{memory} · "
                          f"chat template {template} · http://{host}:{port}/v1", markup=False)
        received = run_server(service, host=host, port=port, api_key=api_key,
                              log_level="debug" if verbose else "info")
    if received is not None:
        err_console.print(f"stopped by {signal.Signals(received).name}; models closed", markup=False)
