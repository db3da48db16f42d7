"""Bad model files and incompatible drafts give named errors, never a crash."""

from __future__ import annotations

import os

import pytest

from specdec_gguf import EngineError, SpeculativeDecoder, VocabMismatchError
from specdec_gguf.drafters import AutoregressiveDrafter
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.modelfile import summarize
from specdec_gguf.tiny import write_incompatible_draft


def test_missing_file(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(EngineError, match=f"{path}: no such file"):
        LlamaCppEngine(path)


def test_directory(tmp_path):
    with pytest.raises(EngineError, match="is a directory"):
        LlamaCppEngine(tmp_path)


def test_not_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("hello, I am not a model")
    with pytest.raises(EngineError, match=r"not a GGUF file \(magic b'hell'"):
        LlamaCppEngine(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable(tmp_path, tiny_family):
    path = tmp_path / "locked.gguf"
    path.write_bytes(tiny_family.target.read_bytes())
    path.chmod(0)
    with pytest.raises(EngineError, match="cannot be read"):
        LlamaCppEngine(path)


@pytest.mark.parametrize("keep", [0.1, 0.5, 0.99])
def test_truncated(tmp_path, tiny_family, keep):
    data = tiny_family.target.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(EngineError, match=f"{path}: (truncated|corrupted or truncated)"):
        LlamaCppEngine(path)


def test_unknown_architecture(tmp_path, tiny_family):
    data = tiny_family.target.read_bytes()
    # Same length, so the header stays well-formed: "llama" -> "llamx" in the architecture value.
    needle = b"general.architecture"
    at = data.index(needle) + len(needle) + 4 + 8  # key, value type, string length
    assert data[at:at + 5] == b"llama"
    path = tmp_path / "alien.gguf"
    path.write_bytes(data[:at] + b"llamx" + data[at + 5:])
    with pytest.raises(EngineError, match=f"{path}: llama.cpp could not load the model"):
        LlamaCppEngine(path)


def test_incompatible_draft_names_first_difference(tmp_path, tiny_engines):
    target, _ = tiny_engines
    with LlamaCppEngine(write_incompatible_draft(tmp_path / "alien-vocab.gguf"), n_ctx=128) as draft:
        with pytest.raises(VocabMismatchError, match=r"token 260 differs: target 'a', draft '.+'"):
            SpeculativeDecoder(target, AutoregressiveDrafter(draft), adaptive=False)


def test_summary_of_tiny_model(tiny_family):
    summary = summarize(tiny_family.target)
    assert summary.architecture == "llama"
    assert summary.n_layers == 4
    assert summary.vocab_type == "llama"
    assert summary.special_tokens["bos"] == 1
    assert summary.partial_rollback
    assert summary.tensor_types["F32"] > 0
