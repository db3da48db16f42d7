"""The error hierarchy: the bottom of the import graph (imports nothing from the package).

Every error specdec-gguf raises on purpose is a :class:`SpecDecError`; messages name
the bad value and what is allowed.
"""

from __future__ import annotations


class SpecDecError(Exception):
    """Base class of every error specdec-gguf raises on purpose."""


class EngineError(SpecDecError):
    """An engine could not load, run or be reached (bad file, backend failure, dead child, closed)."""


class RollbackUnsupportedError(EngineError):
    """The engine's memory cannot be cut back to the requested length."""


class ExactnessError(EngineError):
    """Exact mode was asked for, but this llama.cpp build or model is not batch-invariant (the self-test says why)."""


class VocabMismatchError(SpecDecError):
    """Draft and target vocabularies differ, so draft tokens would mean other text."""


class ContextOverflowError(SpecDecError):
    """The prompt (plus room for one new token) does not fit the context window."""


class ConfigError(SpecDecError, ValueError):
    """A setting is invalid: names the setting, the bad value and what is allowed."""


class ChatTemplateError(ConfigError):
    """A conversation cannot be rendered: no chat template, a template error, or a malformed message."""
