"""The child side of ProcessEngine: serves one LlamaCppEngine over two pipes of its own.

Run as ``python -m specdec_gguf.engines.process_child REQUEST_FD REPLY_FD LOGITS_FD`` (the
parent passes those descriptors); the first frame describes the model to load. The child
exits when the request pipe closes (the parent ended or closed it). stdin and stdout are
not used, so whatever the interpreter or a library prints cannot corrupt the protocol.
"""

from __future__ import annotations

import mmap
import os
import sys
import traceback

import numpy as np

from . import wire


def _serve(rfd: int, wfd: int, shm_fd: int) -> None:
    code, payload = wire.read_frame(rfd)
    setup = wire.json_from(payload)
    try:
        from .llama_cpp import LlamaCppEngine
    except ImportError as err:  # the usual cause: llama-cpp-python missing in this interpreter
        wire.write_frame(wfd, wire.ERROR, f"cannot import llama-cpp-python in {sys.executable} ({err})".encode())
        return
    try:
        engine = LlamaCppEngine(setup["model_path"], validate=False, **setup["kwargs"])
    except Exception as err:
        wire.write_frame(wfd, wire.ERROR, str(err).encode())
        return
    shm = mmap.mmap(shm_fd, 0)
    eog = [t for t in range(engine.n_vocab) if engine.is_eog(t)]
    info = {"n_ctx": engine.n_ctx, "n_vocab": engine.n_vocab, "rollback_mode": engine.rollback_mode,
            "architecture": engine.architecture, "bos_token": engine.bos_token, "eos_token": engine.eos_token,
            "add_bos": engine.add_bos, "add_eos": engine.add_eos, "vocab_type": engine.vocab_type,
            "eog_tokens": eog, "pid": os.getpid(), "python": sys.executable,
            "chat_template": engine.chat_template,
            "exactness": engine.exactness.as_dict() if engine.exactness is not None else None,
            "attention": engine.attention.as_dict() if engine.attention is not None else None}
    wire.write_frame(wfd, wire.OK, wire.json_payload(info))
    while True:
        try:
            code, payload = wire.read_frame(rfd)
        except wire.PipeClosed:
            break
        try:
            if code == wire.OP_ARGMAX:
                out = engine.forward_argmax(wire.tokens_from(payload))
                wire.write_frame(wfd, wire.OK, wire.tokens_payload(out))
            elif code == wire.OP_LOGITS:
                logits = engine.forward_logits(wire.tokens_from(payload))  # [n, V]
                dest = np.frombuffer(shm, dtype=np.float32, count=logits.size)
                dest[:] = logits.reshape(-1)
                del dest
                wire.write_frame(wfd, wire.OK)
            elif code == wire.OP_RESET:
                engine.reset(int(wire.tokens_from(payload)[0]))
                wire.write_frame(wfd, wire.OK)
            elif code == wire.OP_ADVANCE:
                engine.advance(wire.tokens_from(payload))
                wire.write_frame(wfd, wire.OK)
            elif code == wire.OP_REMAP:
                shm.close()
                shm = mmap.mmap(shm_fd, 0)
                wire.write_frame(wfd, wire.OK)
            elif code == wire.OP_CALL:
                wire.write_frame(wfd, wire.OK, wire.json_payload(_call(engine, wire.json_from(payload))))
            elif code == wire.OP_CLOSE:
                wire.write_frame(wfd, wire.OK)
                break
            else:
                wire.write_frame(wfd, wire.ERROR, f"unknown operation {code}".encode())
        except Exception as err:
            wire.write_frame(wfd, wire.ERROR, f"{type(err).__name__}: {err}".encode())
    engine.close()


def _call(engine, request: dict):
    method, args = request["method"], request.get("args", [])
    if method == "tokenize":
        return engine.tokenize(*args)
    if method == "token_to_piece":
        return engine.token_to_piece(*args).hex()
    if method == "format_chat":
        return engine.format_chat(*args)
    if method == "profile_key":
        return engine.profile_key
    if method == "decode_seconds":
        return engine.decode_seconds
    if method == "token_texts":
        return [t.hex() for t in engine.token_texts]
    raise ValueError(f"unknown method {method!r}")


def main() -> None:
    rfd, wfd, shm_fd = (int(arg) for arg in sys.argv[-3:])  # the parent puts them last
    sys.stdout = sys.stderr  # stray prints go where the parent keeps the child's stderr
    try:
        _serve(rfd, wfd, shm_fd)
    except wire.PipeClosed:
        pass
    except Exception:
        traceback.print_exc()


if __name__ == "__main__":
    main()
