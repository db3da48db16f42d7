"""ProcessEngine: an engine in a child interpreter, exact, bounded on failure, leaving nothing behind."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest

from specdec_gguf import EngineError, SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import LlamaCppEngine, ProcessEngine

PROMPT = "the model is fast and the draft is not, but the target"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def remote_target(tiny_family):
    engine = ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=512, n_batch=64)
    yield engine
    engine.close()


@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup"])
def test_child_target_gives_same_greedy_output(tiny_engines, remote_target, kind):
    """Strict identity, and why it holds: the child runs the same llama.cpp build on the same
    model and, with a fixed k, receives the same passes as the in-process engine, so its
    logits are bit-identical (test_child_logits_match_in_process) and no near-tie can flip.
    Identity with *plain* decoding holds only up to near-ties (identity.py)."""
    local_target, draft = tiny_engines
    prompt = local_target.tokenize(PROMPT)
    assert remote_target.tokenize(PROMPT) == prompt

    def drafter():
        return AutoregressiveDrafter(draft) if kind == "draft-model" else PromptLookupDrafter()

    expected = SpeculativeDecoder(local_target, drafter(), num_draft_tokens=4, adaptive=False).generate(prompt, 50)
    got = SpeculativeDecoder(remote_target, drafter(), num_draft_tokens=4, adaptive=False).generate(prompt, 50)
    assert got.tokens == expected.tokens
    assert got.stats.accepted == expected.stats.accepted
    assert remote_target.n_past == len(prompt) + len(got.tokens) - 1
    assert remote_target.detokenize(got.tokens) == local_target.detokenize(got.tokens)


def test_child_logits_match_in_process(tiny_engines, remote_target):
    local, _ = tiny_engines
    prompt = local.tokenize(PROMPT)
    local.reset(0)
    remote_target.reset(0)
    want = local.forward_logits(prompt).copy()
    got = remote_target.forward_logits(prompt)
    np.testing.assert_array_equal(got, want)
    # sampling through the child is exact and seeded too
    params = SamplingParams(temperature=0.8, seed=5)
    a = SpeculativeDecoder(local, PromptLookupDrafter(), adaptive=False).generate(prompt, 30, params).tokens
    b = SpeculativeDecoder(remote_target, PromptLookupDrafter(), adaptive=False).generate(prompt, 30, params).tokens
    assert a == b


def test_vocab_check_works_across_processes(tiny_family, remote_target, tmp_path):
    from specdec_gguf import VocabMismatchError
    from specdec_gguf.tiny import write_incompatible_draft

    with LlamaCppEngine(write_incompatible_draft(tmp_path / "bad.gguf"), n_ctx=64) as bad:
        with pytest.raises(VocabMismatchError, match="token 260 differs"):
            SpeculativeDecoder(remote_target, AutoregressiveDrafter(bad), adaptive=False)


def test_killed_child_raises_quickly_and_leaves_no_process(tiny_family):
    engine = ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=512)
    pid = engine.pid
    decoder = SpeculativeDecoder(engine, PromptLookupDrafter(), adaptive=False)
    stream = decoder.stream(engine.tokenize(PROMPT), 200)
    next(stream)
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EngineError, match="exited"):
        for _ in stream:
            pass
    assert time.monotonic() - start < 5
    assert not alive(pid)
    engine.close()


def test_hung_child_times_out_and_is_killed(tiny_family):
    engine = ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=512, call_timeout=1.0)
    pid = engine.pid
    os.kill(pid, signal.SIGSTOP)  # the child stops answering
    start = time.monotonic()
    with pytest.raises(EngineError, match="no answer within 1 s"):
        engine.forward_argmax([1, 2])
    assert time.monotonic() - start < 5
    time.sleep(0.1)
    assert not alive(pid)
    engine.close()


def test_bad_interpreter_path(tiny_family, tmp_path):
    missing = tmp_path / "no-python"
    with pytest.raises(EngineError, match=f"cannot start interpreter '{missing}'"):
        ProcessEngine(tiny_family.target, python=missing)


def test_interpreter_without_llama_cpp_python(tiny_family, tmp_path):
    # An "interpreter" in which `import llama_cpp` fails, as in a venv without llama-cpp-python.
    fake = tmp_path / "python-without-llama"
    fake.write_text(f"""#!/bin/sh
exec {sys.executable} -c "import sys, runpy; sys.modules['llama_cpp'] = None; \\
runpy.run_module('specdec_gguf.engines.process_child', run_name='__main__')" "$@"
""")
    fake.chmod(0o755)
    with pytest.raises(EngineError, match=f"cannot import llama-cpp-python in {sys.executable}"):
        ProcessEngine(tiny_family.target, python=fake)


def test_child_error_comes_back_as_engine_error(remote_target):
    remote_target.reset(0)
    with pytest.raises(EngineError, match="outside the vocabulary"):
        remote_target.forward_argmax([remote_target.n_vocab + 5])
    assert remote_target.n_past == 0
    assert remote_target.forward_argmax([1, 2]).shape == (2,)


def test_close_stops_the_child(tiny_family):
    engine = ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=128)
    pid = engine.pid
    engine.close()
    time.sleep(0.1)
    assert not alive(pid)
    with pytest.raises(EngineError, match="closed"):
        engine.forward_argmax([1])


def test_child_exits_when_parent_is_killed(tiny_family, tmp_path):
    """The child reads its stdin: a parent that dies without closing it still leaves no process."""
    import subprocess

    script = tmp_path / "parent.py"
    script.write_text(f"""
import sys, time
from specdec_gguf.engines import ProcessEngine
engine = ProcessEngine({str(tiny_family.target)!r}, python=sys.executable, n_ctx=64)
print(engine.pid, flush=True)
time.sleep(60)
""")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    assert alive(child_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child_pid)
