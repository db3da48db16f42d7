"""Engine calls in any order, including after close(), never crash the interpreter (issue 14).

The state machine is in tests/engine_machine.py. LlamaCppEngine and ProcessEngine run it
in a child process: a segfault or abort inside llama.cpp shows up as a failed test with the
child's stack (faulthandler), not as a dead test run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import engine_machine
from specdec_gguf.engines import InMemoryEngine

MACHINE = Path(engine_machine.__file__)


def test_in_memory_engine_machine():
    """Fails on an InMemoryEngine that keeps working after close() (the protocol says EngineError), or on a
    decoder stream whose garbage collection cuts a cache that other calls have since extended."""
    engine_machine.run(lambda: InMemoryEngine.random(20, seed=3, n_ctx=40), max_examples=60, steps=30)


@pytest.mark.parametrize("kind, examples, steps", [("llama", 30, 30), ("process", 4, 25)])
def test_llama_engine_machine_in_a_child(tiny_family, kind, examples, steps):
    """Fails (negative return code, a C stack) if any call sequence reaches llama.cpp with a freed model or an
    id it aborts on, e.g. is_eog or bos_token after close(), or an id past int32 overflowing numpy."""
    done = subprocess.run([sys.executable, str(MACHINE), kind, str(tiny_family.target), str(examples), str(steps)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "machine passed" in done.stdout, \
        f"code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
