"""Run by tests/test_interrupts.py: `specdec run` that gets a real SIGINT while llama.cpp is inside a callback.

``python interrupt_load_child.py WHERE MODEL``: WHERE is ``log-load`` (a log line while the
model loads), ``log-context`` (a log line while the context is created) or ``progress``
(the load's progress callback). The signal is sent to this process from inside that
callback, so Python's handler raises KeyboardInterrupt there, inside llama.cpp's C frames:
exactly where a Ctrl-C during a load lands.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import deque

from specdec_gguf.engines.llama_cpp import runtime


def main(where: str, model: str) -> None:
    fired = False

    def fire() -> None:
        nonlocal fired
        if not fired:
            fired = True
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode: inside the callback

    class Lines(deque):
        def append(self, line: str) -> None:
            if (where == "log-load" and "llama_model_loader" in line) or \
                    (where == "log-context" and "llama_context" in line):
                fire()
            super().append(line)

    class Capture(runtime.LogCapture):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.lines = Lines(maxlen=40)

        @property
        def interrupted(self) -> bool:  # read by the progress callback
            if where == "progress":
                fire()
            return self._interrupted

        @interrupted.setter
        def interrupted(self, value: bool) -> None:
            self._interrupted = value

    import specdec_gguf.engines.llama_cpp.engine as engine_module

    engine_module.LogCapture = Capture
    from specdec_cli.app import app

    sys.argv = ["specdec", "run", "-m", model, "-p", "the model is", "-n", "50", "--no-live"]
    try:
        app()
    finally:
        print(f"fired={fired}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
