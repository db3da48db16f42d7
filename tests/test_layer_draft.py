"""benchmarks/layer_draft.py: a draft made of a model's first blocks (the judge's real-model draft)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.errors import ConfigError
from specdec_gguf.tiny import write_tiny_family
from test_bench import _benchmark  # (tests/ is on sys.path: pytest's rootdir conftest)


def _layer_draft():
    return _benchmark("layer_draft")


def _logits(path: Path, tokens: list[int]) -> np.ndarray:
    with LlamaCppEngine(path, n_ctx=128, n_threads=1) as engine:
        return np.array(engine.forward_logits(tokens))  # (a copy: the engine's buffer goes with it)


def test_a_cut_target_is_the_draft_made_of_its_first_blocks(tmp_path):
    """The tiny family's draft is its target's first block with the target's embedding and output; cutting the
    4-block target to 1 block gives that model: the same tensors byte for byte and the same logits (a cut at
    another block, or an embedding or output left out, would differ), block_count 1, the rest of the header
    as the target's."""
    family = write_tiny_family(tmp_path / "family", target_layers=4, draft_layers=1, gain=1.0)
    cut = _layer_draft().write_layer_draft(family.target, tmp_path / "cut.gguf", 1)
    mine, theirs, source = (gguf.GGUFReader(str(p)) for p in (cut, family.draft, family.target))
    assert {t.name: bytes(t.data) for t in mine.tensors} == {t.name: bytes(t.data) for t in theirs.tensors}
    assert mine.fields["llama.block_count"].contents() == 1
    assert mine.fields["general.name"].contents() == source.fields["general.name"].contents()
    tokens = list(range(1, 20))
    logits = _logits(cut, tokens)
    np.testing.assert_array_equal(logits, _logits(family.draft, tokens))
    assert not np.allclose(logits, _logits(family.target, tokens))  # (the cut took blocks away)


def test_a_cut_keeps_at_least_one_block_and_drops_at_least_one(tmp_path):
    family = write_tiny_family(tmp_path, target_layers=4, draft_layers=1)
    write = _layer_draft().write_layer_draft
    for blocks in (0, 4, 7):
        with pytest.raises(ConfigError, match=rf"blocks={blocks} must be 1 to 3 \(.* has 4 blocks\)"):
            write(family.target, tmp_path / "cut.gguf", blocks)
    assert not (tmp_path / "cut.gguf").exists()
    with pytest.raises(ConfigError, match="no GGUF file"):
        write(tmp_path / "missing.gguf", tmp_path / "cut.gguf", 1)
    assert write(family.target, tmp_path / "cut.gguf", 3).is_file()


def test_a_value_per_block_is_cut_with_the_blocks(tmp_path):
    """An architecture's value given per block (here the key/value head count, as an array) keeps the kept blocks'
    entries, so llama.cpp reads one per block of the cut model; other arrays and values stay whole. Fails if the
    array were copied whole or cut where it is not per block."""
    from gguf_edit import rewrite

    family = write_tiny_family(tmp_path / "family", target_layers=4, draft_layers=1)
    per_block = rewrite(family.target, tmp_path / "per-block.gguf", {"llama.attention.head_count_kv": [4, 4, 2, 2]},
                        types={"llama.attention.head_count_kv": gguf.GGUFValueType.ARRAY})
    cut = _layer_draft().write_layer_draft(per_block, tmp_path / "cut.gguf", 2)
    fields = gguf.GGUFReader(str(cut)).fields
    assert list(fields["llama.attention.head_count_kv"].contents()) == [4, 4]
    assert len(fields["tokenizer.ggml.tokens"].contents()) == len(
        gguf.GGUFReader(str(family.target)).fields["tokenizer.ggml.tokens"].contents())
    with LlamaCppEngine(cut, n_ctx=128, n_threads=1) as engine:
        assert engine.forward_logits([1, 2, 3]).shape[0] == 3
