"""Engines, drafters and decoders from validated settings (what the CLI, batch runs and server call)."""

from __future__ import annotations

from .decoder import SpeculativeDecoder
from .drafters import AutoregressiveDrafter, PromptLookupDrafter
from .engine import DrafterEngine, SpeculativeEngine, TextModel
from .errors import ConfigError
from .schedule import ScheduleConstants
from .settings import DrafterSettings, EngineSettings


def open_engine(settings: EngineSettings, *, verbose: bool = False) -> TextModel:
    """Load the model ``settings`` describe, in this process or in ``settings.python``'s."""
    if settings.python is not None:
        from .engines.process import ProcessEngine

        return ProcessEngine(settings.model, python=settings.python, verbose=verbose, **settings.engine_kwargs())
    from .engines.llama_cpp import LlamaCppEngine

    return LlamaCppEngine.from_settings(settings, verbose=verbose)


def make_drafter(settings: DrafterSettings, draft_engine: SpeculativeEngine | None, *,
                 memory_tokens: int = 0) -> DrafterEngine | None:
    """The drafter ``settings.kind`` names (None for plain decoding).

    ``memory_tokens`` > 0 gives prompt lookup a memory of earlier generations (the server's).
    """
    if settings.kind == "none":
        return None
    if settings.kind == "prompt-lookup":
        return PromptLookupDrafter(max_ngram=settings.ngram_max, min_ngram=settings.ngram_min,
                                   memory_tokens=memory_tokens)
    if draft_engine is None:
        raise ConfigError("drafter kind 'draft-model' needs a draft model (-md/--draft-model or [draft])")
    return AutoregressiveDrafter(draft_engine, p_min=settings.p_min)


def make_decoder(target: SpeculativeEngine, settings: DrafterSettings,
                 draft_engine: SpeculativeEngine | None = None, *, profile_cache: bool = True,
                 remember: bool = True, constants: ScheduleConstants | None = None) -> SpeculativeDecoder:
    """A decoder for one run: the drafter plus a fixed or adaptive schedule (cost profiles and
    remembered calibrations from the user cache unless ``profile_cache`` is False; calibrations
    not unless ``remember`` is False; ``constants``: the adaptive schedule's, None for the shipped ones)."""
    return SpeculativeDecoder(target, make_drafter(settings, draft_engine),
                              num_draft_tokens=settings.max_draft_tokens, adaptive=settings.adaptive,
                              draft_min=settings.draft_min, profile_cache=profile_cache,
                              remember=remember, constants=constants)
