"""ProcessEngine under hostile conditions: noisy interpreters, SIGTERM, Ctrl-C during the load, ./py (issue 14)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from specdec_gguf.engines import ProcessEngine


def _script(path, body: str):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_an_interpreter_that_prints_at_start_up_does_not_desync_the_protocol(tiny_family, tmp_path):
    """Fails (a garbled frame, then "no answer within 30 s") when the protocol shares the child's stdout:
    the banner's bytes were read as a frame header."""
    noisy = _script(tmp_path / "noisy-python", f'echo "Welcome to this venv!"\nexec {sys.executable} "$@"\n')
    with ProcessEngine(tiny_family.target, python=noisy, n_ctx=64, load_timeout=30) as engine:
        assert engine.forward_argmax([1, 5, 6]).shape == (3,)
        assert engine.detokenize(engine.tokenize("the model", add_bos=False)).strip() == "the model"


def _open_logits_files(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "specdec-logits-" in target:
            out.append(target)
    return out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_parent_leaves_no_logits_file(tiny_family, tmp_path, sig):
    """SIGTERM (no Python cleanup runs) or SIGKILL to a process with a child engine. Fails while the shared
    logits file keeps its /dev/shm name until close(): it outlived the killed process."""
    script = tmp_path / "parent.py"
    script.write_text(f"""
import sys, time
from specdec_gguf.engines import ProcessEngine
engine = ProcessEngine({str(tiny_family.target)!r}, python=sys.executable, n_ctx=64)
engine.forward_logits([1, 2, 3])
print("ready", flush=True)
time.sleep(120)
""")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        files = _open_logits_files(parent.pid)
        assert files  # the mapping is open
        parent.send_signal(sig)
        parent.wait(timeout=60)
    finally:
        parent.kill()
    leftovers = [f for f in files if os.path.exists(f.removesuffix(" (deleted)"))]
    assert leftovers == []


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_ctrl_c_while_the_child_loads_leaves_no_child(tiny_family, tmp_path):
    """Fails while only an EngineError closed a half-started engine: a KeyboardInterrupt during the load left
    the child running (here: a slow interpreter, still starting)."""
    slow = _script(tmp_path / "slow-python", f'sleep 60\nexec {sys.executable} "$@"\n')
    script = tmp_path / "parent.py"
    script.write_text(f"""
import os, signal, threading
from specdec_gguf.engines import ProcessEngine
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    ProcessEngine({str(tiny_family.target)!r}, python={str(slow)!r}, n_ctx=64)
except KeyboardInterrupt:
    print("interrupted", flush=True)
pid = os.getpid()
print("children:" + open(f"/proc/{{pid}}/task/{{pid}}/children").read().strip(), flush=True)
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "interrupted" in done.stdout, done.stderr
    assert done.stdout.strip().endswith("children:")  # no child process left


def test_a_relative_interpreter_path_is_a_path_not_a_name(tiny_family, tmp_path):
    """`--target-python ./py` runs ./py. Fails while the option is a Path: Path('./py') prints as 'py', and
    'py' was looked up on PATH ("cannot start interpreter 'py'")."""
    # A wrapper, not a symlink: a symlink to a venv's python starts the base interpreter (no pyvenv.cfg
    # beside it), which has no llama-cpp-python unless the machine happens to have it installed globally.
    wrapper = tmp_path / "py"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "specdec_cli.app", "run", "-m", str(tiny_family.target),
                           "--target-python", "./py", "-p", "the model", "-n", "4", "--no-live", "-c", "64"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "generation throughput" in done.stderr + done.stdout
