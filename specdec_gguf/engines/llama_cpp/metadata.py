"""Reading a loaded llama.cpp model's GGUF metadata (the engine's architecture, the attention timing's head width)."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as lc


def meta_str(model: Any, key: str, size: int = 128) -> str | None:
    """The model's metadata value for ``key`` as text (None: not in the file, or longer than ``size`` bytes)."""
    buf = ctypes.create_string_buffer(size)
    n = lc.llama_model_meta_val_str(model, key.encode(), buf, size)
    return buf.value.decode(errors="replace") if 0 <= n < size else None
