"""LlamaCppEngine: a GGUF model in llama.cpp through llama-cpp-python's low-level API.

The only module that imports ``llama_cpp``. One reusable ``llama_batch`` is filled
through numpy views; logits are read through a numpy view of llama.cpp's output
buffer, and only for the positions a call needs.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from functools import cached_property
from pathlib import Path
from typing import Literal, Sequence

import llama_cpp as lc
import numpy as np

from ..engine import ConfigError, EngineError, RollbackUnsupportedError, SpeculativeEngine
from ..modelfile import RECURRENT_ARCHES, validate_gguf

RollbackMode = Literal["auto", "seq_rm", "checkpoint"]
_SPLIT_MODES = {"none": lc.LLAMA_SPLIT_MODE_NONE, "layer": lc.LLAMA_SPLIT_MODE_LAYER,
                "row": lc.LLAMA_SPLIT_MODE_ROW}
_FLASH_ATTN = {"auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class _Log:
    """llama.cpp's log sink: silent unless verbose, but keeps the last lines for error messages."""

    verbose = False
    recent: list[str] = []

    @staticmethod
    @lc.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace")
        _Log.recent = (_Log.recent + [line])[-20:]
        if _Log.verbose:
            print(line, end="", file=sys.stderr, flush=True)

    @classmethod
    def last_error(cls) -> str:
        lines = [ln.strip() for ln in cls.recent if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
        return (errors or lines or ["no message from llama.cpp"])[-1]


lc.llama_log_set(_Log.callback, ctypes.c_void_p(0))
lc.llama_backend_init()


class LlamaCppEngine(SpeculativeEngine):
    """A GGUF model with one sequence's KV cache.

    Placement and threading are per engine, so a CPU draft can sit beside a GPU
    target; ``devices`` names the ggml devices to use (``specdec backends`` lists them, e.g.
    ``["CUDA0"]``); ``rpc_servers`` (``host:port``, a GGML_RPC build) puts layers on llama.cpp RPC
    servers on other machines. ``rollback`` chooses how rejected tokens leave the cache: ``"seq_rm"``
    cuts the memory (attention models), ``"checkpoint"`` saves the sequence state
    before each forward and restores + re-advances (recurrent/hybrid models);
    ``"auto"`` picks by architecture and reports its choice in ``rollback_mode``.
    Arrays returned by ``forward_logits`` are views valid until the next call on this
    engine; copy them to keep them.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, n_ctx: int = 4096, n_batch: int = 512,
                 n_ubatch: int | None = None, n_gpu_layers: int = 0, main_gpu: int = 0,
                 split_mode: str = "layer", tensor_split: Sequence[float] | None = None,
                 n_threads: int | None = None, n_threads_batch: int | None = None,
                 use_mmap: bool = True, flash_attn: str = "auto", rollback: RollbackMode = "auto",
                 rpc_servers: Sequence[str] = (), devices: Sequence[str] | None = None,
                 verbose: bool = False, validate: bool = True) -> None:
        self.model_path = Path(model_path)
        self._model = self._ctx = None
        self._batch: lc.llama_batch | None = None
        _check_choice("split_mode", split_mode, _SPLIT_MODES)
        _check_choice("flash_attn", flash_attn, _FLASH_ATTN)
        _check_choice("rollback", rollback, {"auto": 0, "seq_rm": 0, "checkpoint": 0})
        if n_ctx < 0 or n_batch < 1:
            raise ConfigError(f"n_ctx={n_ctx} must be >= 0 (0: the model's) and n_batch={n_batch} >= 1")
        if validate:  # ProcessEngine's child skips it: the parent validated the file already
            self.architecture: str = validate_gguf(self.model_path).fields["general.architecture"]
        else:
            self.architecture = "unknown"
        _Log.verbose = verbose
        _Log.recent = []
        add_rpc_servers(rpc_servers)  # remote devices join the registry before the model loads

        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.main_gpu = main_gpu
        mparams.split_mode = _SPLIT_MODES[split_mode]
        mparams.use_mmap = use_mmap
        if devices:
            self._devices = _device_list(devices)  # kept alive: llama.cpp reads it during the load
            mparams.devices = ctypes.cast(self._devices, ctypes.c_void_p)
        if tensor_split:
            self._tensor_split = (ctypes.c_float * len(tensor_split))(*tensor_split)  # kept alive
            mparams.tensor_split = self._tensor_split
        self._model = lc.llama_model_load_from_file(str(self.model_path).encode(), mparams)
        if not self._model:
            raise EngineError(f"{self.model_path}: llama.cpp could not load the model ({_Log.last_error()})")

        threads = n_threads or max(1, (os.cpu_count() or 2))
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_ubatch or n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = threads
        cparams.n_threads_batch = n_threads_batch or threads
        cparams.flash_attn_type = _FLASH_ATTN[flash_attn]
        cparams.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise EngineError(f"{self.model_path}: llama.cpp could not create a context ({_Log.last_error()})")

        if not validate:
            buf = ctypes.create_string_buffer(128)
            if lc.llama_model_meta_val_str(self._model, b"general.architecture", buf, 128) > 0:
                self.architecture = buf.value.decode()
        self._vocab = lc.llama_model_get_vocab(self._model)
        self._mem = lc.llama_get_memory(self._ctx)
        self._n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self._n_ctx = int(lc.llama_n_ctx(self._ctx))
        self._n_batch = int(lc.llama_n_batch(self._ctx))
        self._history = np.zeros(self._n_ctx, dtype=np.int32)  # the tokens in the cache
        self._positions = np.arange(self._n_ctx, dtype=np.int32)
        self.decode_seconds = 0.0  # time inside llama_decode (for overhead measurements)
        self._n_past = 0
        self._logits_addr = 0
        self._logits = np.empty((0, self._n_vocab), dtype=np.float32)
        self._init_batch()

        recurrent = self.architecture in RECURRENT_ARCHES or bool(
            lc.llama_model_is_recurrent(self._model) or lc.llama_model_is_hybrid(self._model))
        if rollback == "seq_rm" and recurrent:
            self.close()
            raise RollbackUnsupportedError(
                f"{self.model_path}: {self.architecture} memory cannot be cut partially; "
                "use rollback='checkpoint' or 'auto'")
        self.rollback_mode: str = ("checkpoint" if recurrent else "seq_rm") if rollback == "auto" else rollback
        self._ckpt_buf: ctypes.Array | None = None
        self._ckpt_len = 0
        self._ckpt_n_past = -1

    # -- construction helpers -------------------------------------------------------------
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
            self._restore_checkpoint(n_past)

    def advance(self, tokens: Sequence[int]) -> None:
        self._decode(tokens, first_logit=len(tokens))

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        if self.rollback_mode == "checkpoint":
            self._save_checkpoint()
        return self._decode(tokens, first_logit=0)  # [n, V] view

    def forward_argmax(self, tokens: Sequence[int]) -> np.ndarray:
        return np.argmax(self.forward_logits(tokens), axis=1).astype(np.int32)

    def forward_last_logits(self, tokens: Sequence[int]) -> np.ndarray:
        if self.rollback_mode == "checkpoint":
            self._save_checkpoint()
        return self._decode(tokens, first_logit=len(tokens) - 1)[0]  # [V] view, one pass

    def forward_last_argmax(self, tokens: Sequence[int]) -> int:
        return int(np.argmax(self.forward_last_logits(tokens)))

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    # -- decoding ---------------------------------------------------------------------------
    def _decode(self, tokens: Sequence[int], *, first_logit: int) -> np.ndarray | None:
        """One pass over ``tokens``; logits for positions >= ``first_logit`` (``[n - first_logit, V]``).

        Token ids are not re-checked here: llama_decode rejects ids outside the vocabulary
        with an error code, which becomes an EngineError below.
        """
        toks = np.asarray(tokens, dtype=np.int32)
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
            t0 = time.perf_counter()
            rc = lc.llama_decode(self._ctx, self._batch)
            self.decode_seconds += time.perf_counter() - t0
            if rc != 0:
                # On failure llama.cpp may keep processed ubatches: cut back to what we know.
                lc.llama_memory_seq_rm(self._mem, 0, self._n_past, -1)
                raise EngineError(f"{self.model_path}: llama_decode returned {rc} at n_past={self._n_past} "
                                  f"({_Log.last_error()})")
            self._history[self._n_past:self._n_past + m] = toks[start:start + m]
            self._n_past += m
            rows = m - rows_from
            if rows > 0:
                view = self._logits_view()[:rows]  # [rows, V]
                if out is None:
                    return view
                done = start + rows_from - first_logit
                out[done:done + rows] = view
        return out

    def _logits_view(self) -> np.ndarray:
        """A numpy view over llama.cpp's logits buffer, rebuilt only when the buffer moves."""
        ptr = lc.llama_get_logits(self._ctx)
        addr = ctypes.addressof(ptr.contents)
        if addr != self._logits_addr:
            self._logits_addr = addr
            self._logits = np.ctypeslib.as_array(ptr, shape=(self._n_batch, self._n_vocab))
        return self._logits

    # -- checkpoint rollback ----------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        if self._ckpt_n_past == self._n_past:
            return
        size = lc.llama_state_seq_get_size_ext(self._ctx, 0, 0)
        if self._ckpt_buf is None or len(self._ckpt_buf) < size:
            self._ckpt_buf = (ctypes.c_uint8 * size)()
        self._ckpt_len = lc.llama_state_seq_get_data_ext(self._ctx, self._ckpt_buf, size, 0, 0)
        if self._ckpt_len == 0:
            raise RollbackUnsupportedError(f"{self.model_path}: llama.cpp could not save the sequence state")
        self._ckpt_n_past = self._n_past

    def _restore_checkpoint(self, n_past: int) -> None:
        lc.llama_memory_seq_rm(self._mem, 0, -1, -1)  # removing a whole sequence never fails
        replay_from = 0
        if 0 <= self._ckpt_n_past <= n_past:
            if lc.llama_state_seq_set_data_ext(self._ctx, self._ckpt_buf, self._ckpt_len, 0, 0) == 0:
                raise RollbackUnsupportedError(f"{self.model_path}: llama.cpp could not restore the checkpoint")
            replay_from = self._ckpt_n_past
        replay = self._history[replay_from:n_past].copy()
        self._n_past = replay_from
        self._ckpt_n_past = -1 if replay_from == 0 else self._ckpt_n_past
        self.advance(replay)

    # -- vocabulary ---------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Text -> token ids; ``add_bos`` adds BOS where the model wants it; ``special`` parses special tokens."""
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, special)
        return list(buf[:n])

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        """The bytes one token stands for (may be part of a UTF-8 character)."""
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode("utf-8", errors="replace")

    def format_chat(self, user_text: str) -> str:
        """Wrap ``user_text`` as one user turn in the model's own chat template, ready for the reply.

        Raises EngineError if the model has no template llama.cpp knows.
        """
        template = lc.llama_model_chat_template(self._model, None)
        if not template:
            raise EngineError(f"{self.model_path}: the model has no chat template; drop --chat")
        msg = (lc.llama_chat_message * 1)(lc.llama_chat_message(b"user", user_text.encode("utf-8")))
        cap = 2 * len(user_text.encode("utf-8")) + 512
        buf = ctypes.create_string_buffer(cap)
        n = lc.llama_chat_apply_template(template, msg, 1, True, buf, cap)
        if n > cap:
            buf = ctypes.create_string_buffer(n)
            n = lc.llama_chat_apply_template(template, msg, 1, True, buf, n)
        if n < 0:
            raise EngineError(f"{self.model_path}: llama.cpp does not support this model's chat template")
        return buf.raw[:n].decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> int:
        return int(lc.llama_vocab_bos(self._vocab))

    @property
    def eos_token(self) -> int:
        return int(lc.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self._vocab))

    @property
    def add_eos(self) -> bool:
        return bool(lc.llama_vocab_get_add_eos(self._vocab))

    @property
    def vocab_type(self) -> int:
        return int(lc.llama_vocab_type(self._vocab))

    @cached_property
    def token_texts(self) -> tuple[bytes, ...]:
        """Every token's text, read once and cached (for the vocabulary check)."""
        get = lc.llama_vocab_get_text
        return tuple(get(self._vocab, i) or b"" for i in range(self._n_vocab))

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

    def __enter__(self) -> LlamaCppEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _check_choice(name: str, value: str, allowed: dict) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} must be one of {sorted(allowed)}")


class PeerPromptLookup:
    """llama-cpp-python's own speculative path (``Llama`` + ``LlamaPromptLookupDecoding``), for side-by-side benchmarks.

    Note: llama-cpp-python turns on ``logits_all`` with a draft model, so it keeps
    n_ctx × n_vocab floats; keep ``n_ctx`` modest.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, n_ctx: int = 2048, n_threads: int | None = None,
                 num_pred_tokens: int = 10) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        validate_gguf(model_path)
        self._llm = lc.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=n_threads,
                             n_threads_batch=n_threads,
                             draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens),
                             verbose=False)

    def generate(self, prompt_tokens: Sequence[int], max_tokens: int) -> tuple[list[int], float]:
        """Greedy tokens and generation throughput (tok/s after the first token, prefill excluded)."""
        llm = self._llm
        tokens: list[int] = []
        t_first = t_last = 0.0
        for token in llm.generate(list(prompt_tokens), temp=0.0, top_k=1, reset=True):
            now = time.perf_counter()  # end-of-generation tokens are kept, as in our benchmarks
            if not tokens:
                t_first = now
            t_last = now
            tokens.append(int(token))
            if len(tokens) >= max_tokens:
                break
        rate = (len(tokens) - 1) / (t_last - t_first) if len(tokens) > 1 and t_last > t_first else 0.0
        return tokens, rate

    def close(self) -> None:
        self._llm.close()


def _ggml_lib() -> ctypes.CDLL | None:
    """The ggml library this llama-cpp-python build loaded (for the device registry)."""
    lib_dir = Path(lc.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (lib_dir / name).exists():
            try:
                return ctypes.CDLL(str(lib_dir / name))
            except OSError:
                return None
    return None


def backend_report() -> dict:
    """This interpreter's llama-cpp-python build: versions, CPU features, GPU/RPC support, devices."""
    devices = []
    lib = _ggml_lib()
    if lib is not None and hasattr(lib, "ggml_backend_dev_count"):
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
            getattr(lib, fn).restype = ctypes.c_char_p
            getattr(lib, fn).argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)]
        for i in range(lib.ggml_backend_dev_count()):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            devices.append({"name": lib.ggml_backend_dev_name(dev).decode(),
                            "description": lib.ggml_backend_dev_description(dev).decode(),
                            "memory_free": free.value, "memory_total": total.value})
    return {
        "python": sys.executable,
        "llama_cpp_python": lc.__version__,
        "system_info": lc.llama_print_system_info().decode("utf-8", errors="replace").strip(" |"),
        "gpu_offload": bool(lc.llama_supports_gpu_offload()),
        "rpc": bool(lc.llama_supports_rpc()),
        "mmap": bool(lc.llama_supports_mmap()),
        "devices": devices,
    }


def _device_list(names: Sequence[str]) -> ctypes.Array:
    """A NULL-terminated array of ggml device handles for ``llama_model_params.devices``."""
    lib = _ggml_lib()
    if lib is None:
        raise EngineError("cannot open this build's ggml library to select devices")
    lib.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    handles = []
    for name in names:
        handle = lib.ggml_backend_dev_by_name(name.encode())
        if not handle:
            known = ", ".join(d["name"] for d in backend_report()["devices"])
            raise EngineError(f"device {name!r} is not in this build (devices: {known})")
        handles.append(handle)
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


def add_rpc_servers(servers: Sequence[str]) -> None:
    """Register llama.cpp RPC servers (``host:port``) as devices, as llama.cpp's ``--rpc`` does.

    Needs a build with GGML_RPC=on; raises EngineError naming what is missing otherwise.
    """
    if not servers:
        return
    if not lc.llama_supports_rpc():
        raise EngineError("this llama-cpp-python build has no RPC backend; rebuild it with "
                          "CMAKE_ARGS='-DGGML_RPC=on' pip install --force-reinstall llama-cpp-python")
    lib = _ggml_lib()
    if lib is None:
        raise EngineError("cannot open this build's ggml library to register RPC servers")
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    add = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not add:
        raise EngineError("the RPC backend does not offer ggml_backend_rpc_add_server (llama.cpp too old?)")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    for server in servers:
        server_reg = add_server(server.encode())
        if not server_reg:
            raise EngineError(f"cannot connect to RPC server {server!r}")
        lib.ggml_backend_register(server_reg)
