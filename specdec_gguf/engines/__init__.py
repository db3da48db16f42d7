"""Engines: models behind the SpeculativeEngine protocol.

``LlamaCppEngine`` and ``ProcessEngine`` are imported lazily so that importing this
package never loads llama.cpp.
"""

from __future__ import annotations

from typing import Any

from .memory import InMemoryEngine

__all__ = ["InMemoryEngine", "LlamaCppEngine", "ProcessEngine"]


def __getattr__(name: str) -> Any:
    if name == "LlamaCppEngine":
        from .llama_cpp import LlamaCppEngine
        return LlamaCppEngine
    if name == "ProcessEngine":
        from .process import ProcessEngine
        return ProcessEngine
    raise AttributeError(name)
