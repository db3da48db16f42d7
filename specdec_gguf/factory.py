"""Engines, drafters and decoders from validated settings (what the CLI and batch runs call)."""

from __future__ import annotations

from .config import DrafterSettings, EngineSettings
from .decoder import SpeculativeDecoder
from .drafters import AutoregressiveDrafter, PromptLookupDrafter
from .engine import ConfigError, DrafterEngine, SpeculativeEngine


def open_engine(settings: EngineSettings, *, verbose: bool = False) -> SpeculativeEngine:
    """Load the model ``settings`` describe, in this process or in ``settings.python``'s."""
    kwargs = dict(n_ctx=settings.n_ctx, n_batch=settings.n_batch, n_gpu_layers=settings.n_gpu_layers,
                  main_gpu=settings.main_gpu, split_mode=settings.split_mode,
                  tensor_split=settings.tensor_split, n_threads=settings.n_threads,
                  n_threads_batch=settings.n_threads_batch, use_mmap=settings.use_mmap,
                  flash_attn=settings.flash_attn, rollback=settings.rollback,
                  rpc_servers=tuple(settings.rpc_servers or ()), devices=settings.devices, verbose=verbose)
    if settings.python is not None:
        from .engines.process import ProcessEngine

        return ProcessEngine(settings.model, python=settings.python, **kwargs)
    from .engines.llama_cpp import LlamaCppEngine

    return LlamaCppEngine(settings.model, **kwargs)


def make_drafter(settings: DrafterSettings, draft_engine: SpeculativeEngine | None) -> DrafterEngine | None:
    """The drafter ``settings.kind`` names (None for plain decoding)."""
    if settings.kind == "none":
        return None
    if settings.kind == "prompt-lookup":
        return PromptLookupDrafter(max_ngram=settings.ngram_max, min_ngram=settings.ngram_min)
    if draft_engine is None:
        raise ConfigError("drafter kind 'draft-model' needs a draft model (-md/--draft-model or [draft])")
    return AutoregressiveDrafter(draft_engine, p_min=settings.p_min)


def make_decoder(target: SpeculativeEngine, settings: DrafterSettings,
                 draft_engine: SpeculativeEngine | None = None) -> SpeculativeDecoder:
    """A decoder for one run: the drafter plus a fixed or adaptive schedule."""
    return SpeculativeDecoder(target, make_drafter(settings, draft_engine),
                              num_draft_tokens=settings.num_draft_tokens, adaptive=settings.adaptive)
