"""LlamaCppEngine: a GGUF model in llama.cpp through llama-cpp-python's low-level API.

One reusable ``llama_batch`` is filled through numpy views; logits are read through a
numpy view of llama.cpp's output buffer, and only for the positions a call needs.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from functools import cached_property
from pathlib import Path
from typing import Sequence

import llama_cpp as lc
import numpy as np

from ...attention import AttentionChoice
from ...engine import EngineBase, argmax_ids, token_array
from ...errors import EngineError, RollbackUnsupportedError
from ...exactness import Exactness, not_exact_error
from ...modelfile import RECURRENT_ARCHES, validate_gguf
from ...settings import EngineSettings
from .backends import add_rpc_servers, build_id, device_list, extra_buffers_allowed
from .exactness import apply_environment, note_compute, self_test, tiled_invariant
from .attention import choose_flash_attn
from .metadata import meta_str
from .checkpoint import StateCheckpoint
from .runtime import LogCapture, ensure_initialised
from .vocab import LlamaVocab

_SPLIT_MODES = {"none": lc.LLAMA_SPLIT_MODE_NONE, "layer": lc.LLAMA_SPLIT_MODE_LAYER,
                "row": lc.LLAMA_SPLIT_MODE_ROW}
_FLASH_ATTN = {"auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class LlamaCppEngine(EngineBase):
    """A GGUF model with one sequence's KV cache; implements ``SpeculativeEngine`` and ``TextModel``.

    Keyword arguments are :class:`~specdec_gguf.settings.EngineSettings` fields and are
    validated there. Placement and threading are per engine, so a CPU draft can sit
    beside a GPU target. ``rollback`` chooses how rejected tokens leave the cache:
    ``"seq_rm"`` cuts the memory (attention models), ``"checkpoint"`` saves the sequence
    state before each forward and restores + re-advances (recurrent/hybrid models);
    ``"auto"`` picks by architecture and reports its choice in ``rollback_mode``.
    ``exact`` loads with the batch-invariant settings and self-tests at load; the verdict is
    ``exactness`` (None when exact mode is off); exact=True raises ExactnessError unless it
    says bit-invariant.
    Arrays returned by ``forward_*`` are views valid until the next call on this engine.
    After ``close()`` every call raises EngineError.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, verbose: bool = False, validate: bool = True,
                 **settings: object) -> None:
        self._model = self._ctx = None
        self._batch: lc.llama_batch | None = None
        self.settings = s = EngineSettings(model=Path(model_path), **settings)  # type: ignore[arg-type]
        self.model_path = s.model
        if validate:  # ProcessEngine's child skips it: the parent validated the file already
            self.architecture: str = validate_gguf(self.model_path).fields["general.architecture"]
        else:
            self.architecture = "unknown"
        ensure_initialised()
        self.log = LogCapture(verbose)
        with self.log.active():
            self._load(s)
        if not validate:
            self.architecture = meta_str(self._model, "general.architecture") or self.architecture
        self._mem = lc.llama_get_memory(self._ctx)
        self._n_vocab = self.vocab.n_vocab
        self._n_ctx = int(lc.llama_n_ctx(self._ctx))
        self._n_batch = int(lc.llama_n_batch(self._ctx))
        self._history = np.zeros(self._n_ctx, dtype=np.int32)  # the tokens in the cache
        self._positions = np.arange(self._n_ctx, dtype=np.int32)
        self.decode_seconds = 0.0  # time inside llama_decode (for overhead measurements)
        self._n_past = 0
        self._logits_addr = 0
        self._logits = np.empty((0, self._n_vocab), dtype=np.float32)
        self._init_batch()

        recurrent = self._recurrent()
        if s.rollback == "seq_rm" and recurrent:
            self.close()
            raise RollbackUnsupportedError(
                f"{self.model_path}: {self.architecture} memory cannot be cut partially; "
                "use rollback='checkpoint' or 'auto'")
        self.rollback_mode: str = ("checkpoint" if recurrent else "seq_rm") if s.rollback == "auto" else s.rollback
        self._checkpoint = StateCheckpoint(str(self.model_path))
        self.exactness: Exactness | None = None
        if s.exact:  # the self-test: one-token vs batched logits, bitwise
            self.exactness = self_test(self, self._model, threads=int(lc.llama_n_threads(self._ctx)),
                                       threads_batch=int(lc.llama_n_threads_batch(self._ctx)),
                                       n_ubatch=int(lc.llama_n_ubatch(self._ctx)))
            if s.exact is True and not self.exactness.invariant:
                self.close()
                raise not_exact_error(str(self.model_path), self.exactness)

    @classmethod
    def from_settings(cls, settings: EngineSettings, *, verbose: bool = False) -> LlamaCppEngine:
        """The engine ``settings`` describe (``settings.python`` is ProcessEngine's business)."""
        return cls(settings.model, verbose=verbose, **settings.engine_kwargs())

    # -- construction helpers -------------------------------------------------------------
    def _load(self, s: EngineSettings) -> None:
        add_rpc_servers(s.rpc_servers or ())  # remote devices join the registry before the model loads
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = s.n_gpu_layers
        mparams.main_gpu = s.main_gpu
        mparams.split_mode = _SPLIT_MODES[s.split_mode]
        # 0.3.x replaced use_mmap with load_mode; a ctypes Structure silently accepts unknown attributes.
        mparams.load_mode = lc.LLAMA_LOAD_MODE_MMAP if s.use_mmap else lc.LLAMA_LOAD_MODE_NONE
        # Repacked weights: GEMM for batches, GEMV for one token (not bit-invariant); AMX ones may crash.
        self.extra_buffers = not s.exact and extra_buffers_allowed()
        mparams.use_extra_bufts = self.extra_buffers
        if s.exact:
            apply_environment()
        log = self.log

        @lc.llama_progress_callback
        def progress(fraction: float, user_data: ctypes.c_void_p) -> bool:
            try:
                return not log.interrupted  # returning False makes llama.cpp abandon the load
            except KeyboardInterrupt:
                log.interrupted = True
                return False

        self._progress = progress  # kept alive while llama.cpp may call it
        mparams.progress_callback = progress
        if s.devices:
            self._devices = device_list(s.devices)  # kept alive: llama.cpp reads it during the load
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if s.tensor_split:
            self._tensor_split = (ctypes.c_float * len(s.tensor_split))(*s.tensor_split)  # kept alive
            mparams.tensor_split = self._tensor_split
        self._model = lc.llama_model_load_from_file(str(self.model_path).encode(), mparams)
        self._raise_if_interrupted()
        if not self._model:
            raise EngineError(f"{self.model_path}: llama.cpp could not load the model ({log.reason()})")
        self.vocab = LlamaVocab(self._model, str(self.model_path))  # (here: the flash attention timing reads it)

        threads = s.n_threads or max(1, (os.cpu_count() or 2))
        self._threads = (threads, s.n_threads_batch or threads)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = s.n_ctx
        cparams.n_batch = s.n_batch
        cparams.n_ubatch = s.n_ubatch or s.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = threads
        cparams.n_threads_batch = s.n_threads_batch or threads
        cparams.no_perf = True
        self.attention: AttentionChoice | None = None  # flash attention chosen by timing (see attention.py)
        if s.exact:
            cparams.flash_attn_type = _FLASH_ATTN["off"]
        elif s.flash_attn == "auto" and self._on_cpu(s) and not self._recurrent():
            self.attention = choose_flash_attn(self._model, cparams, self._speed_key(), max(self.vocab.bos_token, 0),
                                               s.n_ctx)
            chosen = self.attention.flash_attn
            cparams.flash_attn_type = _FLASH_ATTN["auto" if chosen is None else "on" if chosen else "off"]
        else:
            cparams.flash_attn_type = _FLASH_ATTN[s.flash_attn]
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        self._raise_if_interrupted()
        if not self._ctx:
            self.close()
            raise EngineError(f"{self.model_path}: llama.cpp could not create a context ({log.reason()})")

    def _raise_if_interrupted(self) -> None:
        """Ctrl-C that arrived inside a llama.cpp callback: free what was made, then raise it here."""
        if self.log.interrupted:
            self.log.interrupted = False
            self.close()
            raise KeyboardInterrupt

    def _init_batch(self) -> None:
        n = self._n_batch
        self._batch = lc.llama_batch_init(n, 0, 1)
        b = self._batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(n,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(n,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        for i in range(n):  # every token belongs to sequence 0, set once
            b.seq_id[i][0] = 0

    def _check_open(self) -> None:
        if self._ctx is None:
            raise EngineError(f"{self.model_path}: the engine is closed")

    # -- protocol ---------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def tokens(self) -> np.ndarray:
        """The tokens in the KV cache (a read-only view)."""
        view = self._history[: self._n_past]
        view.flags.writeable = False
        return view

    def reset(self, n_past: int) -> None:
        self._check_open()
        if not 0 <= n_past <= self._n_past:
            raise EngineError(f"reset({n_past}) outside [0, n_past={self._n_past}]")
        if n_past == self._n_past:
            return
        if self.rollback_mode == "seq_rm":
            if not lc.llama_memory_seq_rm(self._mem, 0, n_past, -1):
                raise RollbackUnsupportedError(
                    f"{self.model_path}: llama.cpp could not remove positions >= {n_past} "
                    "(partial removal unsupported for this memory); use rollback='checkpoint'")
            self._n_past = n_past
        else:
            replay_from = self._checkpoint.restore(self._ctx, self._mem, n_past)
            replay = self._history[replay_from:n_past].copy()
            self._n_past = replay_from
            self.advance(replay)

    def advance(self, tokens: Sequence[int]) -> None:
        self._decode(tokens, first_logit=len(tokens))

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        if self.rollback_mode == "checkpoint":
            self._save_checkpoint()
        return self._decode(tokens, first_logit=0)  # [n, V] view

    def forward_argmax(self, tokens: Sequence[int]) -> np.ndarray:
        start = self._n_past
        return argmax_ids(self.forward_logits(tokens), str(self.model_path), start)

    def forward_last_logits(self, tokens: Sequence[int]) -> np.ndarray:
        if len(tokens) == 0:
            raise EngineError("forward_last_* needs at least one token")
        if self.rollback_mode == "checkpoint":
            self._save_checkpoint()
        return self._decode(tokens, first_logit=len(tokens) - 1)[0]  # [V] view, one pass

    def forward_last_argmax(self, tokens: Sequence[int]) -> int:
        logits = self.forward_last_logits(tokens)
        return int(argmax_ids(logits, str(self.model_path), self._n_past - 1))

    def is_eog(self, token: int) -> bool:
        self._check_open()
        return self.vocab.is_eog(token)

    def _save_checkpoint(self) -> None:
        self._check_open()
        self._checkpoint.save(self._ctx, self._n_past)

    # -- decoding ---------------------------------------------------------------------------
    def _decode(self, tokens: Sequence[int], *, first_logit: int) -> np.ndarray:
        """One pass over ``tokens``; logits for positions >= ``first_logit`` (``[n - first_logit, V]``)."""
        self._check_open()
        # llama.cpp aborts on some out-of-range ids instead of returning an error: check first.
        toks = token_array(tokens, self._n_vocab, f"{self.model_path}: token")
        n = toks.shape[0]
        want = n - first_logit  # rows of logits to return
        if n == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        if self._n_past + n > self._n_ctx:
            raise EngineError(f"context full: {self._n_past} + {n} tokens > n_ctx={self._n_ctx}")
        out = None
        if want > 0 and n > self._n_batch:  # rare: a pass longer than one batch
            out = np.empty((want, self._n_vocab), dtype=np.float32)
        for start in range(0, n, self._n_batch):
            m = min(self._n_batch, n - start)
            self._b_token[:m] = toks[start:start + m]
            self._b_pos[:m] = self._positions[self._n_past:self._n_past + m]
            rows_from = min(max(first_logit - start, 0), m)  # first position in this chunk with logits
            self._b_logits[:rows_from] = 0
            self._b_logits[rows_from:m] = 1
            self._batch.n_tokens = m
            committed = self._n_past
            note_compute()  # exact mode: llama.cpp reads GGML_CPU_TILED_MM at its first product
            try:
                t0 = time.perf_counter()
                with self.log.active():
                    rc = lc.llama_decode(self._ctx, self._batch)
                self.decode_seconds += time.perf_counter() - t0
                if rc != 0:
                    raise EngineError(f"{self.model_path}: llama_decode returned {rc} at n_past={self._n_past} "
                                      f"({self.log.reason()})")
                self._history[self._n_past:self._n_past + m] = toks[start:start + m]
                self._n_past += m
            except BaseException:
                # A failed pass may keep processed ubatches, and a Ctrl-C can land after llama.cpp wrote
                # this chunk but before our record of it: cut the memory back to the record.
                if self._n_past == committed:
                    lc.llama_memory_seq_rm(self._mem, 0, committed, -1)
                raise
            rows = m - rows_from
            if rows > 0:
                view = self._logits_view()[:rows]  # [rows, V]
                if out is None:
                    return view
                done = start + rows_from - first_logit
                out[done:done + rows] = view
        return out if out is not None else np.empty((0, self._n_vocab), dtype=np.float32)

    def _logits_view(self) -> np.ndarray:
        """A numpy view over llama.cpp's logits buffer, rebuilt only when the buffer moves."""
        ptr = lc.llama_get_logits(self._ctx)
        addr = ctypes.addressof(ptr.contents)
        if addr != self._logits_addr:
            self._logits_addr = addr
            self._logits = np.ctypeslib.as_array(ptr, shape=(self._n_batch, self._n_vocab))
        return self._logits

    # -- text (TextModel) ---------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Text -> token ids; ``add_bos`` adds BOS where the model wants it; ``special`` parses special tokens."""
        self._check_open()
        return self.vocab.tokenize(text, add_bos, special)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes one token stands for (may be part of a UTF-8 character)."""
        self._check_open()
        return self.vocab.token_to_piece(token, special)

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        self._check_open()
        return self.vocab.detokenize(tokens, special)

    def format_chat(self, user_text: str) -> str:
        """Wrap ``user_text`` as one user turn in the model's own chat template, ready for the reply."""
        self._check_open()
        return self.vocab.format_chat(user_text)

    @property
    def chat_template(self) -> str | None:
        self._check_open()
        return self.vocab.chat_template

    @cached_property
    def profile_key(self) -> str:
        """Model file identity, the settings that change speed, the build and the machine."""
        chosen = None if self.attention is None else self.attention.flash_attn
        return self._speed_key(flash_attn_chosen=chosen)

    def _speed_key(self, **more: object) -> str:
        """``profile_key``'s parts known before the context exists (and ``more``)."""
        stat = self.model_path.stat()
        s = self.settings
        speed = {k: v for k, v in s.engine_kwargs().items() if k not in ("n_ctx", "rollback", "use_mmap")}
        return json.dumps({"file": [str(self.model_path.resolve()), stat.st_size, stat.st_mtime_ns],
                           "settings": speed, "threads": self._threads, "build": build_id(),
                           "tiled_matmul": tiled_invariant(), "extra_buffers": self.extra_buffers,  # exact mode sets it for the process
                           **more}, sort_keys=True, default=str)

    @staticmethod
    def _on_cpu(s: EngineSettings) -> bool:
        """Whether the model's layers run on the CPU (no offload, no devices named): where flash attention
        is timed before it is chosen."""
        return s.n_gpu_layers == 0 and not s.devices and not s.rpc_servers

    def _recurrent(self) -> bool:
        """Whether the model keeps a recurrent (or hybrid) state: its memory can't be cut back partially."""
        return self.architecture in RECURRENT_ARCHES or bool(
            lc.llama_model_is_recurrent(self._model) or lc.llama_model_is_hybrid(self._model))

    def _open_vocab(self) -> LlamaVocab:
        """The vocabulary, which lives inside the model: reading it after close() would touch freed memory."""
        self._check_open()
        return self.vocab

    bos_token = property(lambda self: self._open_vocab().bos_token)
    eos_token = property(lambda self: self._open_vocab().eos_token)
    add_bos = property(lambda self: self._open_vocab().add_bos)
    add_eos = property(lambda self: self._open_vocab().add_eos)
    vocab_type = property(lambda self: self._open_vocab().vocab_type)
    token_texts = property(lambda self: self._open_vocab().token_texts)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
        self._ctx = None
        if self._model:
            lc.llama_model_free(self._model)
        self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
