"""The pipe protocol between ProcessEngine and its child: small binary frames, logits in shared memory.

Frame: ``<B op or status><I payload length>`` then the payload. Hot operations carry
int32 token ids; rare ones carry JSON. Logits never travel through the pipe: the
child writes them into a file-backed shared mapping the parent reads in place.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

HEADER = struct.Struct("<BI")

# operations (parent -> child)
OP_RESET, OP_ADVANCE, OP_ARGMAX, OP_LOGITS, OP_IS_EOG, OP_CALL, OP_REMAP, OP_CLOSE = range(1, 9)
# statuses (child -> parent)
OK, ERROR = 0, 1


class PipeClosed(Exception):
    """The other side closed the pipe (exited or crashed)."""


def read_exact(fd: int, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            raise PipeClosed
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def write_frame(fd: int, code: int, payload: bytes = b"") -> None:
    data = HEADER.pack(code, len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int) -> tuple[int, bytes]:
    code, length = HEADER.unpack(read_exact(fd, HEADER.size))
    return code, read_exact(fd, length) if length else b""


def tokens_payload(tokens: Any) -> bytes:
    return np.asarray(tokens, dtype="<i4").tobytes()


def tokens_from(payload: bytes) -> np.ndarray:
    return np.frombuffer(payload, dtype="<i4")


def json_payload(obj: Any) -> bytes:
    return json.dumps(obj).encode("utf-8")


def json_from(payload: bytes) -> Any:
    return json.loads(payload.decode("utf-8"))
