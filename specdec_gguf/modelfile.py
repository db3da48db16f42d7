"""GGUF files before llama.cpp sees them: validation and a summary for `specdec inspect`.

llama.cpp aborts the process on some malformed files; reading the header with the
``gguf`` package first turns those into an EngineError that names the path.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .errors import EngineError
from .hparams import check_hparams

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


def block_of(tensor_name: str) -> int | None:
    """The block a tensor belongs to (``blk.7.attn_q.weight`` -> 7), or None for the embedding, output and
    other tensors outside the blocks."""
    parts = tensor_name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else None


@contextmanager
def written_whole(final: Path) -> Iterator[Path]:
    """A temporary path beside ``final`` to write a model file to: renamed to ``final`` when the block
    ends normally, removed when it raises, so ``final`` holds a whole file or none (an interrupted
    write must not leave a partial model that later runs would load)."""
    partial = final.with_name(f".{final.name}.{os.getpid()}.partial")
    try:
        yield partial
        os.replace(partial, final)  # atomic on one file system
    finally:
        partial.unlink(missing_ok=True)


def _fail(path: Path, reason: str) -> EngineError:
    return EngineError(f"{path}: {reason}")


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_name: str
    n_elements: int
    data_offset: int  # from the start of the file
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """The parsed key/value section (arrays as ``("array", element_type, count)``) and tensor infos."""

    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]


class _Cursor:
    """Bounds-checked little-endian reads over the file's bytes."""

    def __init__(self, data: bytes | mmap.mmap, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise _fail(self.path, f"truncated or corrupted header: {what} at byte {self.pos} needs "
                                   f"{n} bytes, the file has {len(self.data)}")

    def scalar(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def _check_unique(self, texts: list[bytes], what: str) -> None:
        """Raise if two entries read as the same C string (up to a NUL; empty ones llama.cpp renames)."""
        if b"\0" not in b"".join(texts):
            nonempty = [t for t in texts if t] if b"" in texts else texts
            if len(set(nonempty)) == len(nonempty):
                return  # (the common case, at C speed)
        seen: dict[bytes, int] = {}
        for i, raw in enumerate(texts):
            text = raw.split(b"\0", 1)[0]
            if text and seen.setdefault(text, i) != i:
                raise _fail(self.path, f"corrupted header: {what} holds {text[:40]!r} twice "
                                       f"(entries {seen[text]} and {i})")

    def value(self, vtype: int, what: str, unique: bool = False) -> Any:
        """One value; ``unique`` checks that a string array holds no string twice (llama.cpp
        aborts on a vocabulary with a duplicate token)."""
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype, count = self.scalar("<I", what), self.scalar("<Q", what)
            if etype in _SCALAR:
                size = struct.calcsize(_SCALAR[etype]) * count
                self.need(size, what)
                self.pos += size
            elif etype == _STRING:
                # (Tight: a vocabulary is read at every load, 262,144 strings on Gemma 3 270M: 0.25 s -> 0.10 s.)
                unpack, data, pos, end = struct.unpack_from, self.data, self.pos, len(self.data)
                texts: list[bytes] = []
                keep = texts.append if unique else None
                for _ in range(count):
                    if end - pos < 8:
                        self.pos = pos
                        self.need(8, what)  # (raises)
                    (n,) = unpack("<Q", data, pos)
                    pos += 8
                    if n > end - pos:
                        self.pos = pos
                        self.need(n, what)  # (raises)
                    if keep is not None:
                        keep(data[pos:pos + n])
                    pos += n
                self.pos = pos
                if texts:
                    self._check_unique(texts, what)
            else:
                raise _fail(self.path, f"corrupted header: {what} has array element type {etype}")
            return ("array", etype, count)
        raise _fail(self.path, f"corrupted header: {what} has value type {vtype} (valid: 0-12)")


def read_header(path: Path) -> GGUFHeader:
    """Parse and bounds-check a GGUF header without trusting any length in it."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # constants only

    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # (its slices are bytes)
    cur = _Cursor(data, path)
    cur.pos = 4
    version = cur.scalar("<I", "version")
    n_tensors, n_kv = cur.scalar("<Q", "tensor count"), cur.scalar("<Q", "key count")
    if n_tensors > len(data) // 24 or n_kv > len(data) // 12:
        raise _fail(path, f"corrupted header: {n_tensors} tensors / {n_kv} keys cannot fit in {len(data)} bytes")
    fields: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"key {i}")
        fields[key] = cur.value(cur.scalar("<I", f"type of {key!r}"), repr(key), unique=key == "tokenizer.ggml.tokens")
    infos = []
    for i in range(n_tensors):
        name = cur.string(f"tensor {i} name")
        n_dims = cur.scalar("<I", f"tensor {name!r} dims")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise _fail(path, f"corrupted header: tensor {name!r} has {n_dims} dimensions (1-{_MAX_DIMS})")
        shape = tuple(cur.scalar("<Q", f"tensor {name!r} shape") for _ in range(n_dims))
        type_id, offset = cur.scalar("<I", f"tensor {name!r} type"), cur.scalar("<Q", f"tensor {name!r} offset")
        try:
            qtype = GGMLQuantizationType(type_id)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise _fail(path, f"corrupted header: tensor {name!r} has unknown type {type_id}") from None
        n_el = 1
        for d in shape:
            n_el *= d
        if n_el == 0 or shape[0] % block:
            raise _fail(path, f"corrupted header: tensor {name!r} shape {shape} does not fit type {qtype.name}")
        infos.append((name, shape, qtype.name, n_el, offset, n_el // block * block_bytes))
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1:
        raise _fail(path, f"corrupted header: general.alignment={alignment!r}")
    data_start = -(-cur.pos // alignment) * alignment
    tensors = [TensorInfo(n, s, t, e, data_start + o, b) for n, s, t, e, o, b in infos]
    for t in tensors:
        if t.data_offset + t.n_bytes > len(data):
            raise _fail(path, f"truncated: tensor {t.name!r} ends at byte {t.data_offset + t.n_bytes} "
                              f"but the file has {len(data)}")
    return GGUFHeader(version=version, fields=fields, tensors=tensors)


def validate_gguf(path: str | os.PathLike[str]) -> GGUFHeader:
    """Check that ``path`` is a complete, readable GGUF file; return its parsed header.

    Raises EngineError naming the path and what is wrong (missing, a directory,
    unreadable, not GGUF, truncated, corrupted header).
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode  # before any open(): opening a FIFO would block until a writer comes
    except FileNotFoundError:
        raise _fail(p, "no such file") from None
    except OSError as err:
        raise _fail(p, f"cannot be read ({err.strerror or err})") from None
    if stat.S_ISDIR(mode):
        raise _fail(p, "is a directory, not a GGUF file")
    if not stat.S_ISREG(mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file")
        raise _fail(p, f"is {kind}, not a regular GGUF file (models are memory-mapped, so they must be files)")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as err:
        raise _fail(p, f"cannot be read ({err.strerror or err})") from None
    if head[:4] != GGUF_MAGIC:
        raise _fail(p, f"not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})")
    if len(head) < 8:
        raise _fail(p, f"truncated: {len(head)} bytes, but a GGUF header needs at least 24")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise _fail(p, f"unsupported GGUF version {version} (supported: 2, 3)")
    header = read_header(p)
    arch = header.fields.get("general.architecture")
    if not isinstance(arch, str):
        raise _fail(p, "missing the 'general.architecture' key")
    check_hparams(p, header.fields, recurrent=arch in RECURRENT_ARCHES)
    return header


def summarize(path: str | os.PathLike[str]) -> ModelSummary:
    """Read the facts `specdec inspect` prints, validating the file first."""
    header = validate_gguf(path)
    fields = header.fields
    arch = fields["general.architecture"]
    tokens = fields.get("tokenizer.ggml.tokens")
    special = {role: int(fields[f"tokenizer.ggml.{role}_token_id"])
               for role in ("bos", "eos", "eot", "unknown", "padding")
               if isinstance(fields.get(f"tokenizer.ggml.{role}_token_id"), int)}
    return ModelSummary(
        path=Path(path), architecture=arch, name=str(fields.get("general.name", Path(path).stem)),
        n_params=sum(t.n_elements for t in header.tensors), file_bytes=Path(path).stat().st_size,
        tensor_types=dict(Counter(t.type_name for t in header.tensors).most_common()),
        context_length=fields.get(f"{arch}.context_length"), n_layers=fields.get(f"{arch}.block_count"),
        vocab_type=fields.get("tokenizer.ggml.model"),
        n_vocab=tokens[2] if isinstance(tokens, tuple) else 0,
        special_tokens=special, partial_rollback=arch not in RECURRENT_ARCHES,
    )
