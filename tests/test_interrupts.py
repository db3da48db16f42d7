"""Ctrl-C lands wherever llama.cpp happens to be; it is never swallowed and never leaves an engine unusable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CHILD = Path(__file__).with_name("interrupt_load_child.py")


@pytest.mark.parametrize("where", ["log-load", "log-context", "progress"])
def test_ctrl_c_inside_a_llama_cpp_callback_during_load_stops_the_run(tiny_family, where):
    """A real SIGINT whose handler runs inside llama.cpp's log or progress callback while `specdec run` loads
    the model: the run exits 130 before generating. Fails (the run carries on and prints a summary, exit 0)
    if the callback swallows the KeyboardInterrupt without recording it for the engine to re-raise."""
    done = subprocess.run([sys.executable, str(CHILD), where, str(tiny_family.target)], capture_output=True,
                          text=True, timeout=300)
    assert "fired=True" in done.stderr  # the signal really arrived inside the callback
    assert done.returncode == 130, done.stderr[-2000:]
    assert "interrupted" in done.stderr
    assert done.stdout == "" and "throughput" not in done.stderr  # nothing was generated


def test_ctrl_c_right_after_a_pass_leaves_the_engine_usable(tiny_family, monkeypatch):
    """The signal arrives as llama_decode returns, before the engine records the pass. Fails without the cut
    back to the engine's record: the next pass at those positions returned -1 (inconsistent positions)."""
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.engines.llama_cpp import engine as engine_module

    with LlamaCppEngine(tiny_family.target, n_ctx=64, n_batch=16) as engine:
        engine.advance([1, 5, 6])
        want = engine.forward_logits([7, 8]).copy()
        engine.reset(3)
        real = engine_module.lc.llama_decode

        def decode_then_interrupt(ctx, batch):
            real(ctx, batch)
            raise KeyboardInterrupt

        monkeypatch.setattr(engine_module.lc, "llama_decode", decode_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            engine.forward_logits([7, 8])
        monkeypatch.setattr(engine_module.lc, "llama_decode", real)
        assert engine.n_past == 3
        np.testing.assert_allclose(engine.forward_logits([7, 8]), want, atol=1e-5)
