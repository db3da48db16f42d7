"""ProcessEngine: a LlamaCppEngine served by another Python interpreter (another llama.cpp build).

One process can load only one llama-cpp-python build, so a CPU draft beside a CUDA or
Metal target in another build runs that engine in a child process. Greedy passes move
only token ids over the pipe; logits rows arrive in a file-backed shared mapping.
Every call has a deadline: a child that dies or hangs becomes an EngineError, and the
child is killed, never left behind. The protocol runs on pipes of its own (passed to the
child as extra file descriptors), so an interpreter that prints at start-up cannot
corrupt it; the shared logits file is unlinked as soon as it is created, so no signal,
however abrupt, leaves it in /dev/shm.
"""

from __future__ import annotations

import atexit
import mmap
import os
import select
import subprocess
import sys
import tempfile
import time
import weakref
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..engine import EngineBase, token_array
from ..errors import EngineError
from ..attention import AttentionChoice
from ..exactness import Exactness, not_exact_error
from ..modelfile import validate_gguf
from ..settings import EngineSettings, interpreter_path
from . import wire

_LIVE: weakref.WeakSet[ProcessEngine] = weakref.WeakSet()
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


@atexit.register
def _close_all() -> None:
    for engine in list(_LIVE):
        engine.close()


def _package_root() -> str:
    """The folder holding ``specdec_gguf``, so the child imports this same code."""
    return str(Path(__file__).resolve().parents[2])


class ProcessEngine(EngineBase):
    """The full engine protocol over a pipe to ``python -m specdec_gguf.engines.process_child``.

    ``python`` is the interpreter to run (for example another venv's ``bin/python`` with
    a CUDA build of llama-cpp-python); the other keyword arguments are
    :class:`~specdec_gguf.settings.EngineSettings` fields, validated here and passed to
    LlamaCppEngine in the child. ``call_timeout`` bounds every call, ``load_timeout`` the
    model load. Implements ``SpeculativeEngine`` and ``TextModel``; logits arrays are
    views of the shared mapping, valid until the next call on this engine.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, python: str | os.PathLike[str] | None = None,
                 call_timeout: float = 120.0, load_timeout: float = 600.0, verbose: bool = False,
                 **settings: Any) -> None:
        self.settings = EngineSettings(model=Path(model_path), **settings)  # validated here, once
        self.model_path = self.settings.model
        self.python = str(interpreter_path(python) if python else sys.executable)
        self.call_timeout = call_timeout
        self._proc: subprocess.Popen | None = None
        self._shm: mmap.mmap | None = None
        self._shm_fd = self._rfd = self._wfd = -1
        self._pieces: dict[int, bytes] = {}
        self._info: dict[str, Any] | None = None
        self._shm_rows = 0
        validate_gguf(self.model_path)  # here, so the child interpreter needs no `gguf` package
        kwargs = self.settings.engine_kwargs()
        if kwargs["exact"]:
            kwargs["exact"] = "warn"  # the child reports its verdict; the policy (raise or not) is decided here
        self._start({**kwargs, "verbose": verbose}, load_timeout)
        _LIVE.add(self)
        chosen = self._info.get("attention")  # type: ignore[union-attr]  (flash attention as the child's auto chose it)
        self.attention: AttentionChoice | None = AttentionChoice.from_dict(chosen) if chosen else None
        verdict = self._info.get("exactness")  # type: ignore[union-attr]
        self.exactness: Exactness | None = Exactness.from_dict(verdict) if verdict else None
        if self.settings.exact is True and self.exactness is not None and not self.exactness.invariant:
            self.close()
            raise not_exact_error(f"{self.model_path} in {self.python}", self.exactness)

    # -- child lifecycle ------------------------------------------------------------------
    def _start(self, engine_kwargs: dict[str, Any], load_timeout: float) -> None:
        try:
            self._spawn()
            setup = {"model_path": str(self.model_path.resolve()), "kwargs": engine_kwargs}
            info = wire.json_from(self._request(wire.OP_CALL, wire.json_payload(setup), timeout=load_timeout))
        except BaseException:  # an error, or Ctrl-C during a long load: no child, no file left behind
            self.close()
            raise
        self._info = info
        self._history = np.zeros(info["n_ctx"], dtype=np.int32)  # mirror of the child's cache
        self._n_past = 0
        self._eog = frozenset(info["eog_tokens"])
        self._chat_template: str | None = info.get("chat_template")
        self.rollback_mode: str = info["rollback_mode"]
        self.architecture: str = info["architecture"]
        self.pid: int = info["pid"]
        self._ensure_rows(min(64, info["n_ctx"]))

    def _spawn(self) -> None:
        """Start the child with three descriptors of its own: requests in, replies out, the logits file."""
        shm_fd, shm_path = tempfile.mkstemp(prefix="specdec-logits-", dir=_SHM_DIR)
        os.unlink(shm_path)  # both sides use the descriptor; the memory goes when the last one closes
        self._shm_fd = shm_fd
        os.ftruncate(shm_fd, mmap.PAGESIZE)  # grown once the vocabulary size is known
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
        child_r, self._wfd = os.pipe()
        self._rfd, child_w = os.pipe()
        try:
            # stdout goes to the stderr capture: whatever the interpreter prints there is harmless.
            self._proc = subprocess.Popen(
                [self.python, "-m", "specdec_gguf.engines.process_child", str(child_r), str(child_w), str(shm_fd)],
                stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr, env=env,
                pass_fds=(child_r, child_w, shm_fd), start_new_session=True)
        except OSError as err:
            raise EngineError(f"cannot start interpreter {self.python!r}: {err.strerror or err}") from None
        finally:
            os.close(child_r)  # the child's ends: with them closed here, EOF means the other side is gone
            os.close(child_w)

    def _ensure_rows(self, rows: int) -> None:
        """Grow the shared logits mapping to hold ``rows`` rows of the vocabulary (both sides remap)."""
        if rows <= self._shm_rows:
            return
        size = rows * self.n_vocab * 4
        os.ftruncate(self._shm_fd, size)
        _release(self._shm)
        self._shm = mmap.mmap(self._shm_fd, size)
        self._shm_rows = rows
        self._request(wire.OP_REMAP)

    def _fail(self, what: str) -> EngineError:
        """Kill the child and describe why, with the tail of its stderr."""
        self._kill()
        tail = ""
        try:
            self._stderr.seek(0)
            lines = self._stderr.read().decode("utf-8", errors="replace").strip().splitlines()
            tail = f"; child stderr: {lines[-1]}" if lines else ""
        except (OSError, ValueError):
            pass
        return EngineError(f"{self.model_path} in {self.python}: {what}{tail}")

    def _request(self, op: int, payload: bytes = b"", timeout: float | None = None) -> bytes:
        proc = self._proc
        if proc is None:
            raise EngineError(f"{self.model_path}: the engine process is closed")
        try:
            wire.write_frame(self._wfd, op, payload)
            status, body = self._read_frame(self._rfd, timeout or self.call_timeout)
        except (BrokenPipeError, wire.PipeClosed):
            code = proc.poll()
            raise self._fail(f"the engine process exited (code {code})") from None
        if status == wire.ERROR:
            raise EngineError(f"{self.model_path} in {self.python}: {body.decode('utf-8', errors='replace')}")
        return body

    def _read_frame(self, fd: int, timeout: float) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        header = self._read_exact(fd, wire.HEADER.size, deadline, timeout)
        status, length = wire.HEADER.unpack(header)
        return status, self._read_exact(fd, length, deadline, timeout) if length else b""

    def _read_exact(self, fd: int, n: int, deadline: float, timeout: float) -> bytes:
        chunks, got = [], 0
        while got < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise self._fail(f"no answer within {timeout:g} s (hung)")
            chunk = os.read(fd, n - got)
            if not chunk:
                raise wire.PipeClosed
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                wire.write_frame(self._wfd, wire.OP_CLOSE)
                os.close(self._wfd)
                self._wfd = -1
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        _release(self._shm)
        self._shm = None
        for name in ("_shm_fd", "_rfd", "_wfd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def __enter__(self) -> ProcessEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- protocol --------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self._info["n_ctx"]  # type: ignore[index]

    @property
    def n_vocab(self) -> int:
        return self._info["n_vocab"]  # type: ignore[index]

    @property
    def n_past(self) -> int:
        return self._n_past

    def _check_open(self) -> None:
        if self._proc is None:
            raise EngineError(f"{self.model_path}: the engine process is closed")

    def reset(self, n_past: int) -> None:
        self._check_open()
        if not 0 <= n_past <= self._n_past:
            raise EngineError(f"reset({n_past}) outside [0, n_past={self._n_past}]")
        if n_past != self._n_past:
            self._request(wire.OP_RESET, wire.tokens_payload([n_past]))
            self._n_past = n_past

    @property
    def tokens(self) -> np.ndarray:
        """The tokens in the child's KV cache (a read-only view)."""
        view = self._history[: self._n_past]
        view.flags.writeable = False
        return view

    def _forward(self, op: int, tokens: Sequence[int]) -> bytes:
        self._check_open()
        ids = token_array(tokens, self.n_vocab, f"{self.model_path}: token")  # ids past int32 can't be sent
        body = self._request(op, wire.tokens_payload(ids))
        self._history[self._n_past:self._n_past + len(ids)] = ids
        self._n_past += len(ids)
        return body

    def advance(self, tokens: Sequence[int]) -> None:
        self._check_open()
        if len(tokens):
            self._forward(wire.OP_ADVANCE, tokens)

    def forward_argmax(self, tokens: Sequence[int]) -> np.ndarray:
        return wire.tokens_from(self._forward(wire.OP_ARGMAX, tokens)).astype(np.int32)

    def forward_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits rows as a view of the shared mapping, valid until the next call."""
        self._check_open()
        n = len(tokens)
        self._ensure_rows(n)
        self._forward(wire.OP_LOGITS, tokens)
        return np.frombuffer(self._shm, dtype=np.float32, count=n * self.n_vocab).reshape(n, self.n_vocab)

    def is_eog(self, token: int) -> bool:
        self._check_open()
        return token in self._eog

    # -- vocabulary ----------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        return wire.json_from(self._request(wire.OP_CALL, wire.json_payload({"method": method, "args": args})))

    def tokenize(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self._call("tokenize", text, add_bos, special)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        self._check_open()
        piece = self._pieces.get(token) if not special else None
        if piece is None:
            piece = bytes.fromhex(self._call("token_to_piece", int(token), special))
            if not special:
                self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> str:
        self._check_open()
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode("utf-8", errors="replace")

    def format_chat(self, user_text: str) -> str:
        return self._call("format_chat", user_text)

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @cached_property
    def profile_key(self) -> str:
        return self._call("profile_key")

    @property
    def decode_seconds(self) -> float:
        """Seconds the child's engine spent inside llama_decode (one round trip to ask)."""
        return float(self._call("decode_seconds"))

    @cached_property
    def token_texts(self) -> tuple[bytes, ...]:
        return tuple(bytes.fromhex(t) for t in self._call("token_texts"))

    bos_token = property(lambda self: self._info["bos_token"])
    eos_token = property(lambda self: self._info["eos_token"])
    add_bos = property(lambda self: self._info["add_bos"])
    add_eos = property(lambda self: self._info["add_eos"])
    vocab_type = property(lambda self: self._info["vocab_type"])


def _release(shm: mmap.mmap | None) -> None:
    """Close a mapping unless a caller still holds a view of it (then it lives until that view dies)."""
    if shm is not None:
        try:
            shm.close()
        except BufferError:
            pass  # a kept logits array still points into it: the buffer protocol keeps it alive
