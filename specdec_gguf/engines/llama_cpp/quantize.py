"""Requantize a GGUF model with llama.cpp's own quantizer (``llama_model_quantize``).

The same weights at another quantization are another cost curve on the same text: an F16
Gemma 3 270M at 1 thread pays 2.9 one-token passes for a 2-token pass and 4.5 for a 9-token
one, its Q4_K_M original 2.4 and 6.4. The "never loses" matrix uses this to test the adaptive
schedule on curves nobody tuned it on, with a real model's answers (benchmarks/matrix.py).
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp as lc

from ...errors import ConfigError, EngineError
from ...modelfile import written_whole
from .runtime import LogCapture, ensure_initialised

# The file types offered (llama.cpp's ``llama_ftype``): matrices in that type, 1-d tensors as they are.
# q4_k_m is llama.cpp's mix (most matrices Q4_K, some Q6_K); a matrix whose rows are not a multiple of 256
# falls back to a type that fits them, as llama-quantize does.
FILE_TYPES = {"f16": lc.LLAMA_FTYPE_MOSTLY_F16, "q8_0": lc.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": lc.LLAMA_FTYPE_MOSTLY_Q4_0,
              "q4_k_m": lc.LLAMA_FTYPE_MOSTLY_Q4_K_M}


def requantize(source: str | Path, dest: str | Path, file_type: str, *, threads: int | None = None) -> Path:
    """Write ``source``'s weights to ``dest`` quantized as ``file_type`` (one of FILE_TYPES), requantizing
    tensors that are already quantized (from a Q4_K_M file the result has Q4_K_M's rounding in it: a
    model for timing and for testing policies, not a better model). The file appears whole or not at
    all (written under a temporary name, then renamed). Returns ``dest``."""
    source, dest = Path(source), Path(dest)
    if file_type not in FILE_TYPES:
        raise ConfigError(f"file_type={file_type!r} is not one of {', '.join(FILE_TYPES)}")
    if threads is not None and threads < 1:
        raise ConfigError(f"threads={threads!r} must be >= 1 or None (all cores)")
    if not source.is_file():
        raise ConfigError(f"no GGUF file at {source}")
    ensure_initialised()
    params = lc.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.allow_requantize = True
    params.nthread = threads or 0  # (0: llama.cpp uses every core)
    capture = LogCapture()
    with written_whole(dest) as partial:
        with capture.active():
            status = lc.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
        if status != 0:
            raise EngineError(f"llama.cpp could not quantize {source} to {file_type}: {capture.reason()}")
    return dest
