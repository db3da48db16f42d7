"""llama.cpp through llama-cpp-python: the ONLY package that imports ``llama_cpp``.

- ``engine``: :class:`LlamaCppEngine`, the target/draft engine;
- ``vocab``, ``checkpoint``: its text side and its state-checkpoint rollback;
- ``runtime``: process-wide set-up (backends, the log sink), done by the first engine;
- ``backends``: what this build supports, its devices, llama.cpp RPC servers;
- ``peer``: llama-cpp-python's own prompt-lookup speculation, for `specdec bench`;
- ``quantize``: a model's weights at another quantization (another cost curve, the same text).
"""

from .backends import add_rpc_servers, backend_report
from .engine import LlamaCppEngine
from .quantize import requantize

__all__ = ["LlamaCppEngine", "backend_report", "add_rpc_servers", "requantize"]
