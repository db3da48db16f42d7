"""Which op makes a batched pass differ from one-token passes: ggml's eval callback, tensor by tensor.

A second, small context on the same loaded model is created with ``cb_eval``, which hands
every computed tensor to Python. We run a window of tokens one per pass, then the same
window in passes of each batch size, pair the tensors by (name, op, occurrence), cut the
batched tensor at each position and compare bit for bit. The first tensor (in graph order)
that differs names the op and its sources' types: the kernel to look at. Exact mode's
self-test uses it because quantized models often round a kernel's difference away before
the logits (the tiny Q8_0 model in a llamafile build: attention scores differ, logits
don't) while a longer generation would still meet it. ``benchmarks/find_variant_op.py``
prints it. Tensors are computed one node at a time here, so fused kernels are not traced.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import llama_cpp as lc
import numpy as np

from ...errors import EngineError
from ...exactness import CHECK_BATCH_SIZES, probe_tokens
from .runtime import ensure_initialised


class _Tensor(ctypes.Structure):
    """The head of ggml.h's ``struct ggml_tensor`` (llama-cpp-python 0.3.x layout)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


@dataclass(frozen=True)
class OpDifference:
    """The first tensor of a position's one-token pass that differs from its slice of a batched pass."""

    position: int  # in the window
    batch_size: int
    tensor: str
    op: str
    sources: tuple[str, ...]  # "name:type[ne0,ne1,ne2,ne3]" of each source, as in the one-token pass
    max_abs_diff: float | None  # None when only digests were kept

    def describe(self) -> str:
        types = ", ".join(s.split(":")[1].split("[")[0] for s in self.sources)
        return f"{self.op}({types}) at {self.tensor}"


@dataclass
class TraceResult:
    differences: list[OpDifference] = field(default_factory=list)  # the first per (batch size, position)
    tensors_compared: int = 0
    max_logit_diff: float = 0.0


def _ggml_base() -> ctypes.CDLL:
    lib_dir = Path(lc.__file__).parent / "lib"
    name = next((n for n in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll") if (lib_dir / n).exists()),
                "libggml-base.so")
    lib = ctypes.CDLL(str(lib_dir / name))
    lib.ggml_op_desc.restype = ctypes.c_char_p
    lib.ggml_op_desc.argtypes = [ctypes.c_void_p]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_backend_buffer_is_host.restype = ctypes.c_bool
    lib.ggml_backend_buffer_is_host.argtypes = [ctypes.c_void_p]
    return lib


def _array(t: _Tensor) -> np.ndarray:
    """A copy of an F32 tensor as ``[ne3, ne2, ne1, ne0]`` (strided views included)."""
    ne, nb = list(t.ne), list(t.nb)
    size = sum((n - 1) * b for n, b in zip(ne[1:], nb[1:])) + ne[0] * 4
    raw = np.frombuffer((ctypes.c_char * size).from_address(t.data), dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(raw, shape=(ne[3], ne[2], ne[1], ne[0] * 4),
                                           strides=(nb[3], nb[2], nb[1], 1)).copy().view(np.float32)


class _Recorder:
    """The eval callback: per pass, the F32 tensors keyed by (name, op, occurrence)."""

    def __init__(self) -> None:
        self.ggml = _ggml_base()
        self.pass_tensors: list | None = None  # [(key, sources, array)] while recording
        self.callback = lc.ggml_backend_sched_eval_callback(self._on_tensor)

    def _on_tensor(self, ptr: int, ask: bool, user_data: Any) -> bool:
        if ask or self.pass_tensors is None:
            return self.pass_tensors is not None  # ask: show each tensor once computed, only while recording
        t = _Tensor.from_address(ptr)
        if t.type != lc.GGML_TYPE_F32 or not t.data or t.nb[0] != 4 or not t.buffer:
            return True
        if not self.ggml.ggml_backend_buffer_is_host(t.buffer):
            return True  # in GPU memory: not readable here (the logits comparison still covers it)
        name, op = t.name.decode(), self.ggml.ggml_op_desc(ptr).decode()
        sources = tuple(f"{s.name.decode()}:{self.ggml.ggml_type_name(s.type).decode()}{list(s.ne)}"
                        for s in (_Tensor.from_address(p) for p in t.src if p))
        self.pass_tensors.append(((name, op), sources, _array(t)))
        return True

    def start(self) -> None:
        self.pass_tensors = []

    def stop(self) -> list:
        tensors, self.pass_tensors = self.pass_tensors or [], None
        seen: dict = {}
        out = []
        for (name, op), sources, arr in tensors:  # names repeat (a projection and its rope share one)
            seen[name, op] = seen.get((name, op), 0) + 1
            out.append(((name, op, seen[name, op]), sources, arr))
        return out


def _position_slice(key: tuple, single_shape: tuple, whole: np.ndarray, offset: int, m: int,
                    keep: int) -> np.ndarray | None:
    """Position ``offset`` of a pass over ``m`` tokens, shaped like the one-token tensor (None: can't align)."""
    if whole.shape == single_shape and m == 1:
        part = whole
    else:
        axes = [a for a in range(4) if single_shape[a] == 1 and whole.shape[a] == m]
        if len(axes) != 1:
            return None  # not a per-position tensor, or ambiguous: skipped
        part = np.take(whole, [offset], axis=axes[0])
        if part.shape != single_shape:
            return None
    return part[..., :keep] if key[0].startswith("kq") else part


def _digest(arr: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).digest()


def trace_model(llama_model: Any, *, n_threads: int, n_ubatch: int = 512, flash_attn: bool = False,
                prefix: int = 8, window: int = 17, batch_sizes: Sequence[int] = CHECK_BATCH_SIZES,
                keep_values: bool = False) -> TraceResult:
    """One-token vs batched passes over ``window`` probe tokens after ``prefix``, tensor by tensor, on a
    fresh small context of ``llama_model``. ``keep_values`` keeps the one-token tensors (for differences'
    sizes); otherwise only digests are kept, so memory stays small on large models."""
    recorder = _Recorder()
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = 256 * ((prefix + window) // 256 + 1)
    cparams.n_batch, cparams.n_ubatch, cparams.n_seq_max = 256, min(n_ubatch, 256), 1
    cparams.n_threads = cparams.n_threads_batch = n_threads
    cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.cb_eval = recorder.callback
    cparams.no_perf = True
    ctx = lc.llama_init_from_model(llama_model, cparams)
    if not ctx:
        raise EngineError("llama.cpp could not create a tracing context")
    batch = lc.llama_batch_init(256, 0, 1)
    vocab = lc.llama_model_get_vocab(llama_model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    bos = lc.llama_vocab_bos(vocab)
    tokens = probe_tokens(n_vocab, prefix + window, first=bos if 0 <= bos < n_vocab else None)
    mem = lc.llama_get_memory(ctx)
    result = TraceResult()

    def decode(chunk: Sequence[int], pos: int, logits: bool) -> np.ndarray:
        for i, token in enumerate(chunk):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos + i, 1, logits
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(chunk)
        if lc.llama_decode(ctx, batch) != 0:
            raise EngineError("llama_decode failed in the tracing context")
        return np.ctypeslib.as_array(lc.llama_get_logits(ctx), shape=(len(chunk), n_vocab)).copy() if logits else None

    def restart() -> None:  # whole-sequence removal works for every memory type (recurrent too)
        lc.llama_memory_seq_rm(mem, 0, -1, -1)
        for start in range(0, prefix, 256):
            decode(tokens[start:min(prefix, start + 256)], start, False)

    try:
        restart()
        singles: list[dict] = []
        single_logits = []
        for p in range(window):
            recorder.start()
            single_logits.append(decode([tokens[prefix + p]], prefix + p, True)[0])
            keep = prefix + p + 1  # attention scores past the position are masked later: not compared
            record = {}
            for key, sources, arr in recorder.stop():
                cut = arr[..., :keep] if key[0].startswith("kq") else arr
                record[key] = (sources, arr.shape, cut if keep_values else _digest(cut))
            singles.append(record)
        for size in batch_sizes:
            restart()
            first: dict[int, OpDifference] = {}
            for start in range(0, window, size):
                chunk = tokens[prefix + start:prefix + min(window, start + size)]
                recorder.start()
                rows = decode(chunk, prefix + start, True)
                result.max_logit_diff = max(result.max_logit_diff, float(np.nanmax(np.abs(
                    rows - np.stack(single_logits[start:start + len(chunk)])))))
                for key, _, whole in recorder.stop():
                    for offset in range(len(chunk)):
                        p = start + offset
                        if p in first or key not in singles[p]:
                            continue
                        sources, shape, ref = singles[p][key]
                        part = _position_slice(key, shape, whole, offset, len(chunk), prefix + p + 1)
                        if part is None:
                            continue
                        result.tensors_compared += 1
                        same = (np.array_equal(part.view(np.uint32), ref.view(np.uint32)) if keep_values
                                else _digest(part) == ref)
                        if not same:
                            with np.errstate(invalid="ignore"):
                                diff = float(np.nanmax(np.abs(part - ref))) if keep_values else None
                            first[p] = OpDifference(p, size, key[0], key[1], sources, diff)
            result.differences += [first[p] for p in sorted(first)]
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return result


def trace_window(model: str | os.PathLike[str], *, prefix: int = 8, window: int = 9, exact: bool = True,
                 n_threads: int = 2, flash_attn: bool = False) -> TraceResult:
    """Load ``model`` and trace one pass of ``window`` tokens against one-token passes (the dev tool's entry).
    ``exact`` applies exact mode's settings first (no repacking, GGML_CPU_TILED_MM=0)."""
    from .exactness import apply_environment  # exactness imports this module

    if exact:
        apply_environment()
    ensure_initialised()
    mparams = lc.llama_model_default_params()
    mparams.use_extra_bufts = not exact
    llama_model = lc.llama_model_load_from_file(str(model).encode(), mparams)
    if not llama_model:
        raise EngineError(f"{model}: llama.cpp could not load the model")
    try:
        return trace_model(llama_model, n_threads=n_threads, flash_attn=flash_attn, prefix=prefix, window=window,
                           batch_sizes=(window,), keep_values=True)
    finally:
        lc.llama_model_free(llama_model)
