"""GGUF files before llama.cpp sees them: validation and a summary for `specdec inspect`.

llama.cpp aborts the process on some malformed files; reading the header with the
``gguf`` package first turns those into an EngineError that names the path.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engine import EngineError

GGUF_MAGIC = b"GGUF"
# Architectures whose memory cannot be cut partially (recurrent or hybrid state).
RECURRENT_ARCHES = frozenset({
    "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "jamba", "falcon-h1", "granitehybrid",
    "lfm2", "plamo2", "nemotron_h", "qwen3next",
})


@dataclass(frozen=True)
class ModelSummary:
    """What `specdec inspect` shows about a GGUF file, read without llama.cpp."""

    path: Path
    architecture: str
    name: str
    n_params: int
    file_bytes: int
    tensor_types: dict[str, int]
    context_length: int | None
    n_layers: int | None
    vocab_type: str | None
    n_vocab: int
    special_tokens: dict[str, int] = field(default_factory=dict)
    partial_rollback: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path)}


def _fail(path: Path, reason: str) -> EngineError:
    return EngineError(f"{path}: {reason}")


def validate_gguf(path: str | os.PathLike[str]) -> Any:
    """Check that ``path`` is a complete, readable GGUF file; return its ``gguf.GGUFReader``.

    Raises EngineError naming the path and what is wrong (missing, a directory,
    unreadable, not GGUF, truncated, corrupted header).
    """
    p = Path(path)
    if not p.exists():
        raise _fail(p, "no such file")
    if p.is_dir():
        raise _fail(p, "is a directory, not a GGUF file")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as err:
        raise _fail(p, f"cannot be read ({err.strerror or err})") from None
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise _fail(p, f"not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise _fail(p, f"unsupported GGUF version {version} (supported: 2, 3)")
    import gguf  # deferred: only file checks need it

    try:
        reader = gguf.GGUFReader(str(p), "r")
    except Exception as err:  # the reader raises many types on malformed headers
        raise _fail(p, f"corrupted or truncated GGUF header ({type(err).__name__}: {err})") from None
    size = p.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise _fail(p, f"truncated: tensor {tensor.name!r} ends at byte {end} but the file has {size}")
    if "general.architecture" not in reader.fields:
        raise _fail(p, "missing the 'general.architecture' key")
    return reader


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    value = f.parts[f.data[0]]
    if f.types and f.types[0].name == "STRING":
        return bytes(value).decode("utf-8", errors="replace")
    if f.types and f.types[0].name == "ARRAY":
        return len(f.data)
    return value.tolist()[0] if hasattr(value, "tolist") else value


def summarize(path: str | os.PathLike[str]) -> ModelSummary:
    """Read the facts `specdec inspect` prints, validating the file first."""
    reader = validate_gguf(path)
    arch = _field(reader, "general.architecture") or "?"
    types = Counter(t.tensor_type.name for t in reader.tensors)
    n_vocab = _field(reader, "tokenizer.ggml.tokens") or 0
    special = {}
    for role in ("bos", "eos", "eot", "unknown", "padding"):
        value = _field(reader, f"tokenizer.ggml.{role}_token_id")
        if value is not None:
            special[role] = int(value)
    return ModelSummary(
        path=Path(path), architecture=arch, name=_field(reader, "general.name") or Path(path).stem,
        n_params=int(sum(int(t.n_elements) for t in reader.tensors)),
        file_bytes=Path(path).stat().st_size, tensor_types=dict(types.most_common()),
        context_length=_field(reader, f"{arch}.context_length"),
        n_layers=_field(reader, f"{arch}.block_count"),
        vocab_type=_field(reader, "tokenizer.ggml.model"), n_vocab=int(n_vocab),
        special_tokens=special, partial_rollback=arch not in RECURRENT_ARCHES,
    )
