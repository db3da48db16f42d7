"""llama.cpp's process-wide state: backend initialisation and the log sink, set up by the first engine.

llama.cpp has one global log callback. Each engine owns a :class:`LogCapture`; while
an engine calls into llama.cpp it makes its capture the active one, so an error
message names what *that* engine's call logged, not whatever another engine logged last.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator

import llama_cpp as lc

_lock = threading.Lock()
_initialised = False
_local = threading.local()  # .capture: the LogCapture of the engine calling llama.cpp on this thread


class LogCapture:
    """The last lines llama.cpp logged during one engine's calls; echoed to stderr when verbose."""

    def __init__(self, verbose: bool = False, keep: int = 40) -> None:
        self.verbose = verbose
        self.lines: deque[str] = deque(maxlen=keep)
        self.interrupted = False  # a KeyboardInterrupt arrived while llama.cpp was logging

    @contextmanager
    def active(self) -> Iterator[LogCapture]:
        """Route llama.cpp's log lines from this thread to this capture for the duration.

        Lines from earlier calls are dropped first, so :meth:`reason` speaks of this call. A Ctrl-C
        that arrived inside a log callback (where it cannot propagate) is raised on the way out.
        """
        previous = getattr(_local, "capture", None)
        _local.capture = self
        self.lines.clear()
        try:
            yield self
        finally:
            _local.capture = previous
        if self.interrupted:
            self.interrupted = False
            raise KeyboardInterrupt

    def reason(self) -> str:
        """llama.cpp's own reason for a failure: its first line that says "error" (e.g. "error loading
        model: ..."), else its first that says "failed", else its last line.

        The first, because llama.cpp logs the cause and then each caller's "failed to ..." on the way out.
        """
        lines = [ln.strip() for ln in self.lines if ln.strip()]
        for word in ("error", "failed"):
            found = [ln for ln in lines if word in ln.lower()]
            if found:
                return found[0]
        return (lines or ["no message from llama.cpp"])[-1]


@lc.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    try:
        capture = getattr(_local, "capture", None)
        if capture is None:
            return  # a line from no engine's call (e.g. a worker thread): silent
        line = text.decode("utf-8", errors="replace")
        capture.lines.append(line)
        if capture.verbose:
            print(line, end="", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        # An exception can't cross llama.cpp's C frames: remember it for the caller to re-raise.
        capture = getattr(_local, "capture", None)
        if capture is not None:
            capture.interrupted = True
    except Exception:
        pass


def ensure_initialised() -> None:
    """Initialise llama.cpp's backends and install the log sink, once per process."""
    global _initialised
    with _lock:
        if not _initialised:
            lc.llama_log_set(_log_callback, ctypes.c_void_p(0))
            lc.llama_backend_init()
            _initialised = True
