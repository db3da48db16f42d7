"""`specdec serve`: an OpenAI-compatible HTTP server with speculative decoding."""

from __future__ import annotations

import signal
from typing import Annotated, Optional

import typer

from specdec_gguf import ConfigError
from specdec_gguf.chat import load_chat_template

from .common import err_console, handle_errors
from .options import (DRAFTER, ChatTemplateOpt, loaded_models, ModelSettings, ProfileCacheOpt,
                      VerboseOpt, with_model_settings)

SERVER = "Server"
DEFAULT_LOOKUP_MEMORY = 32768  # tokens: a few long conversations or agent loops


@handle_errors
@with_model_settings
def serve(
    settings: ModelSettings,
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
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} must lie in [1, 65535]")
    if lookup_memory is not None and lookup_memory > 0 and settings.drafter.kind != "prompt-lookup":
        raise ConfigError(f"--lookup-memory {lookup_memory} needs --prompt-lookup (it is prompt lookup's memory)")
    if lookup_memory is None:
        lookup_memory = DEFAULT_LOOKUP_MEMORY if settings.drafter.kind == "prompt-lookup" else 0
    # (Here, not at the top: the web framework's imports cost every other command 0.09 s of its start.)
    from specdec_gguf.server import ModelService, run_server

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
