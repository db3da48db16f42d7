"""specdec-gguf: speculative decoding for GGUF models on llama.cpp."""

from .decoder import GenerationResult, SpeculativeDecoder
from .engine import DrafterEngine, SpeculativeEngine, TextModel
from .errors import (ConfigError, ContextOverflowError, EngineError, RollbackUnsupportedError, SpecDecError,
                     VocabMismatchError)
from .proposal import DraftProposal, DrafterFeatures, VerificationPolicy
from .sampling import SamplingParams
from .stats import SpecStats

__version__ = "0.1.0"

__all__ = [
    "SpeculativeDecoder", "SamplingParams", "GenerationResult", "SpecStats",
    "DraftProposal", "DrafterFeatures", "VerificationPolicy",
    "SpeculativeEngine", "DrafterEngine", "TextModel",
    "SpecDecError", "EngineError", "VocabMismatchError", "RollbackUnsupportedError",
    "ContextOverflowError", "ConfigError",
]
