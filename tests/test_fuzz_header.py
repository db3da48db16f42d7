"""Fuzzed GGUF files give an EngineError or a working model, never a crashed interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("fuzz_header_child.py")


@pytest.mark.parametrize("mode, cases", [("bytes", 300), ("hparams", 200)])
def test_fuzzed_headers_never_crash(tiny_family, tmp_path, mode, cases):
    """``hparams`` fails (the child aborts inside llama.cpp) without specdec_gguf/hparams.py: block_count 0 or
    above 512, a negative or NaN norm epsilon, or expert counts that contradict each other."""
    done = subprocess.run([sys.executable, str(CHILD), mode, str(tiny_family.draft), str(tmp_path), str(cases), "1"],
                          capture_output=True, text=True, timeout=900)
    lines = done.stdout.strip().splitlines()
    last_case = next((ln for ln in reversed(lines) if ln.startswith("case")), "before any case")
    assert done.returncode == 0, f"interpreter died (code {done.returncode}) at {last_case}: {done.stderr[-500:]}"
    assert not [ln for ln in lines if ln.startswith("unexpected")]
    assert lines[-1].startswith("done")
    rejected = int(lines[-1].split("rejected=")[1])
    assert rejected > 0  # the corruption was real
