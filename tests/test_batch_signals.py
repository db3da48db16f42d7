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

[draft]
model = "{family.draft}"
n_ctx = 512

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
