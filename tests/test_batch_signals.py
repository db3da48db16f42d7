"""SIGINT/SIGTERM during `specdec batch`: whole lines only, then --resume completes the set exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

N_PROMPTS = 12


def write_config(tmp_path, family) -> str:
    prompts = "".join(f'\n[[prompts]]\nid = "p{i}"\ntext = "the model number {i} is"\n' for i in range(N_PROMPTS))
    config = tmp_path / "slow.toml"
    config.write_text(f"""
output = "out.jsonl"
max_tokens = 400

[target]
model = "{family.target}"
n_ctx = 512
n_threads = 1

[draft]
model = "{family.draft}"
n_ctx = 512
n_threads = 1

[[runs]]
name = "plain"
kind = "none"

[[runs]]
name = "draft"
kind = "draft-model"
num_draft_tokens = 3
{prompts}""")
    return str(config)


def batch_cmd(config: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "specdec_cli.app", "batch", config, *extra]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_cleanly_and_resume_completes(tiny_family, tmp_path, sig):
    config = write_config(tmp_path, tiny_family)
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(batch_cmd(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and out.read_text().count("\n") >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr
    text = out.read_text()
    assert text.endswith("\n")
    first = [json.loads(line) for line in text.splitlines()]  # every line is whole JSON
    assert 2 <= len(first) < 2 * N_PROMPTS

    done = subprocess.run(batch_cmd(config, "--resume"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    keys = [(r["run"], r["id"]) for r in lines]
    assert len(keys) == len(set(keys)) == 2 * N_PROMPTS
    assert lines[: len(first)] == first  # what was there stays as it was


def write_long_config(tmp_path, family, max_tokens: int, n_prompts: int) -> str:
    """One run, "long", over ``n_prompts`` prompts; the results go to out.jsonl."""
    prompts = "".join(f'\n[[prompts]]\nid = "p{i}"\ntext = "the model number {i} is"\n' for i in range(n_prompts))
    config = tmp_path / f"long{n_prompts}.toml"
    config.write_text(f"""
output = "out.jsonl"

[target]
model = "{family.target}"
n_ctx = 2048
n_threads = 1

[[runs]]
name = "long"
kind = "none"
max_tokens = {max_tokens}
{prompts}""")
    return str(config)


def test_second_signal_drops_the_prompt_in_progress(tiny_family, tmp_path):
    """SIGINT, then SIGINT again while the same prompt runs: that prompt is dropped whole, the lines
    already in the file stay exactly as they were, exit code 130.

    Signals follow events read from the child, not timings: the first once it says p1 starts
    ("[1/2] long · p1"), the second once it says which prompt it is finishing ("stopping after
    long · p1"). If the first landed before that prompt had started (it says
    "stopping before the next prompt"), the attempt proves nothing and is repeated.
    Fails if the second signal were ignored (p1's result would be written) or if a half-written
    line were left."""
    for attempt in range(5):
        outcome = interrupt_twice(tiny_family, tmp_path / f"attempt{attempt}")
        if outcome is not None:
            break
    else:
        pytest.fail("the first signal never landed while a prompt was in progress")
    returncode, stderr, before, after = outcome
    assert returncode == 130, stderr
    assert "interrupted" in stderr and "stopped early" not in stderr  # the second signal's path
    assert after == before  # p1 dropped, p0's line untouched, nothing torn


def interrupt_twice(family, tmp_path) -> tuple[int, str, str, str] | None:
    """One attempt: (exit code, stderr, results before, results after), or None if no prompt was
    in progress when the first signal arrived."""
    import threading

    tmp_path.mkdir()
    done = subprocess.run(batch_cmd(write_long_config(tmp_path, family, 4, 1)), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out.jsonl"
    before = out.read_text()  # p0's line
    proc = subprocess.Popen(batch_cmd(write_long_config(tmp_path, family, 2000, 3), "--resume"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = {"[1/2] long · p1": threading.Event(), "stopping": threading.Event()}
    stderr_lines: list[str] = []

    def read_stderr() -> None:
        for line in proc.stderr:
            stderr_lines.append(line)
            for word, event in events.items():
                if line.startswith(word):
                    event.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert events["[1/2] long · p1"].wait(120), "".join(stderr_lines)
    proc.send_signal(signal.SIGINT)
    assert events["stopping"].wait(60), "".join(stderr_lines)
    answer = next(line for line in stderr_lines if line.startswith("stopping"))
    in_progress = answer.startswith("stopping after long · p1")
    if in_progress:
        proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(10)
    if not in_progress:
        return None
    return proc.returncode, "".join(stderr_lines), before, out.read_text()
