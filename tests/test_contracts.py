"""The code's explicit contracts: import graph, buffer ownership, text-model protocol, settings, and two defects."""

from __future__ import annotations

import ast
import re
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec_gguf import (ConfigError, DraftProposal, SamplingParams, SpeculativeDecoder, TextModel,
                          VocabMismatchError)
from specdec_gguf.drafters import AutoregressiveDrafter
from specdec_gguf.engine import _TEXT_MODEL_MEMBERS, DrafterBase, is_text_model
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.settings import DrafterSettings, EngineSettings

from identity import assert_matches_plain, plain_reference, strict_identity

PACKAGE = Path(__file__).resolve().parents[1] / "specdec_gguf"


def _module_imports(path: Path) -> set[str]:
    """specdec_gguf modules ``path`` imports at run time (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text())
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    package = parts if path.name == "__init__.py" else parts[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # a deferred import inside a function does not make a cycle at import time
            if isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                name = ".".join(base + (child.module.split(".") if child.module else []))
                if name.startswith("specdec_gguf"):
                    found.add(name)
            visit(child)

    visit(tree)
    return found


def test_library_import_graph_has_no_cycle():
    """Fails if a module imports (at import time) something that imports it back, e.g. errors kept in engine.py
    while sampling.py needs them and engine.py needs proposal.py -> sampling.py."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = {m for m in _module_imports(path) if m != name}
    state: dict[str, int] = {}

    def walk(name: str, stack: list[str]) -> None:
        state[name] = 1
        for dep in modules.get(name, ()):
            if dep not in modules or dep == "specdec_gguf":
                continue
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [dep]))
            if dep not in state:
                walk(dep, stack + [dep])
        state[name] = 2

    for name in modules:
        if name not in state:
            walk(name, [name])
    assert _module_imports(PACKAGE / "errors.py") == set()  # the bottom of the graph


def test_in_memory_engine_reuses_its_logits_buffer(target):
    """The buffer-ownership rule made observable: a kept view changes on the next call.
    Fails if InMemoryEngine returned fresh arrays (code keeping views too long would go unnoticed)."""
    first = target.forward_logits([1, 2, 3])
    snapshot = first.copy()
    target.forward_logits([4, 5, 6])
    assert not np.array_equal(first, snapshot)


def test_decoder_copes_with_reused_buffers(target, draft):
    """Greedy speculative output still equals plain output when every engine reuses its buffers."""
    plain = SpeculativeDecoder(target).generate([1, 2], 60).tokens
    target.reset(0)
    spec = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=5, adaptive=False).generate([1, 2], 60)
    assert spec.tokens == plain


class ForeignDrafter(DrafterBase):
    """Proposes two valid ids, then one past the target's vocabulary, then a valid one again."""

    name = "foreign"

    def __init__(self, n_vocab_target: int, width: int) -> None:
        self.n, self.width = n_vocab_target, width

    def start(self, prompt_tokens):
        pass

    def propose(self, max_tokens, policy, rng, budget=None):
        tokens = (1, 2, self.n + 3, 4)[:max_tokens]
        rows = np.full((len(tokens), self.width), 1.0 / self.width, dtype=np.float32)
        return DraftProposal(tokens=tokens, draft_probs=None if policy.greedy else rows)

    def accept(self, n_accepted, committed):
        pass


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_proposal_stops_before_an_id_the_target_cannot_take(target, temperature):
    """Fails (EngineError from the engine, or a shape error in the residual) if the decoder verified ids
    past the target's vocabulary or fed q rows of the draft's width to the sampler."""
    params = SamplingParams(temperature=temperature, seed=3)
    decoder = SpeculativeDecoder(target, ForeignDrafter(target.n_vocab, target.n_vocab + 8), num_draft_tokens=4, adaptive=False)
    result = decoder.generate([1, 2], 20, params)
    assert len(result.tokens) == 20
    assert result.stats.drafted > 0
    assert len(result.stats.per_position_drafted) == 2  # slot 3 (the foreign id) and beyond never verified
    if temperature == 0.0:
        target.reset(0)
        assert result.tokens == SpeculativeDecoder(target).generate([1, 2], 20).tokens


def test_draft_min_skips_short_proposals(target):
    """A proposal shorter than draft_min is not verified. Fails if the decoder ignored draft_min."""

    class Two(ForeignDrafter):
        def propose(self, max_tokens, policy, rng, budget=None):
            return DraftProposal(tokens=(1, 2)[:max_tokens])

    decoder = SpeculativeDecoder(target, Two(target.n_vocab, target.n_vocab), num_draft_tokens=4, draft_min=3, adaptive=False)
    assert decoder.generate([1, 2], 10).stats.drafted == 0
    decoder = SpeculativeDecoder(target, Two(target.n_vocab, target.n_vocab), num_draft_tokens=4, draft_min=2, adaptive=False)
    assert decoder.generate([1, 2], 10).stats.drafted > 0


def test_the_target_engine_cannot_be_its_own_draft(target):
    """Drafting on the target's own cache would corrupt it; refused up front."""
    with pytest.raises(ConfigError, match="draft engine is the target engine"):
        SpeculativeDecoder(target, AutoregressiveDrafter(target), adaptive=False)


def test_in_memory_vocab_sizes_must_match(target):
    other = InMemoryEngine.random(target.n_vocab + 1, seed=1)
    with pytest.raises(VocabMismatchError, match="sizes differ"):
        SpeculativeDecoder(target, AutoregressiveDrafter(other), adaptive=False)


# -- settings: one source of truth --------------------------------------------------------------------
def test_default_draft_length_is_decided_once():
    assert DrafterSettings(kind="draft-model").max_draft_tokens == 8
    assert DrafterSettings(kind="prompt-lookup").max_draft_tokens == 64
    assert DrafterSettings(kind="draft-model", adaptive=False).max_draft_tokens == 4
    assert DrafterSettings(kind="draft-model", num_draft_tokens=3).max_draft_tokens == 3
    assert DrafterSettings(kind="draft-model").resolved()["num_draft_tokens"] == 8


@pytest.mark.parametrize("field, value, message", [
    ("n_threads", 100000, r"n_threads=100000 must be an integer \[1, 512\]"),
    ("n_ctx", -1, r"n_ctx=-1 must be an integer \[0, 2147483647\]"),
    ("n_ctx", 2**32 + 64, r"n_ctx=4294967360 must be an integer \[0, 2147483647\]"),  # ctypes would wrap it to 64
    ("flash_attn", "maybe", "flash_attn='maybe' must be one of"),
    ("split_mode", "diagonal", "split_mode='diagonal' must be one of"),
    ("tensor_split", [1.0, float("nan")], "tensor_split"),
])
def test_engine_settings_validate_once(field, value, message, tiny_family, tmp_path):
    """The same message from the dataclass, the engine constructor and a TOML config."""
    from specdec_gguf.config import load_batch_config
    from specdec_gguf.engines import LlamaCppEngine

    with pytest.raises(ConfigError, match=message):
        EngineSettings(model=tiny_family.target, **{field: value})
    with pytest.raises(ConfigError, match=message):
        LlamaCppEngine(tiny_family.target, **{field: value})
    if isinstance(value, (int, str)):
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[target]\nmodel = "{tiny_family.target}"\n{field} = {json.dumps(value)}\n')
        with pytest.raises(ConfigError, match=re.escape(f"{cfg}: [target]: {field}") + " ?= ?" + re.escape(repr(value))):
            load_batch_config(cfg, require_prompts=False)


# -- llama.cpp engines ------------------------------------------------------------------------------
def test_llama_engines_are_text_models(tiny_engines):
    target, draft = tiny_engines
    assert isinstance(target, TextModel) and isinstance(draft, TextModel)
    before = target.decode_seconds
    target.reset(0)
    target.forward_argmax([1, 5, 6])
    assert target.decode_seconds > before


def test_telling_a_text_model_reads_none_of_its_properties(tiny_engines, target, monkeypatch):
    """``is_text_model`` answers as ``isinstance(x, TextModel)`` does (a llama.cpp engine is one, an in-memory
    engine and one lacking a member are not) without running a property: before Python 3.12 the protocol
    check runs each, and a llama.cpp engine's ``token_texts`` reads the whole vocabulary (0.11 s of every
    decoder's construction on Gemma 3 270M, for prompt lookup, which never needs it). Fails if the check
    read ``token_texts``."""
    engine, _ = tiny_engines
    reads = []
    texts = type(engine).token_texts
    monkeypatch.setattr(type(engine), "token_texts", property(lambda self: reads.append(1) or texts.fget(self)))
    assert is_text_model(engine) and reads == []
    assert isinstance(engine, TextModel)  # (the protocol agrees; before 3.12 it read the texts to say so)
    assert not is_text_model(target) and not isinstance(target, TextModel)

    class Lacking:  # every member but one
        pass

    lacking = Lacking()
    for name in _TEXT_MODEL_MEMBERS - {"tokenize"}:
        setattr(lacking, name, getattr(engine, name))
    assert not is_text_model(lacking) and not isinstance(lacking, TextModel)
    lacking.tokenize = engine.tokenize
    assert is_text_model(lacking) and isinstance(lacking, TextModel)


def test_process_engine_keeps_working_while_a_logits_view_is_held(tiny_family):
    """The reported defect: growing the shared mapping under a live view raised BufferError, and so did close()."""
    from specdec_gguf.engines import ProcessEngine

    engine = ProcessEngine(tiny_family.target, python=sys.executable, n_ctx=256, n_batch=128)
    try:
        assert isinstance(engine, TextModel) and is_text_model(engine)
        kept = engine.forward_logits([5, 6, 7, 8])
        big = engine.forward_logits(list(range(10, 90)))  # needs more rows than the first mapping holds
        assert big.shape == (80, engine.n_vocab)
        assert kept.shape == (4, engine.n_vocab) and np.isfinite(kept).all()
        assert engine.decode_seconds > 0  # named in TextModel; the bench's Python-share column needs it
    finally:
        engine.close()
    assert kept.sum() is not None  # the old mapping outlives close() while the view exists


def test_draft_with_a_larger_vocabulary_never_sends_foreign_ids(tiny_family, tmp_path):
    """A draft vocabulary 100 ids larger than the target's passes the check (as in llama.cpp); a draft that
    prefers those extra ids used to crash the run with llama_decode returning -1."""
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.tiny import TinyShape, _random_weights, _write, tiny_vocab

    n_vocab = len(tiny_vocab("extended")[0])
    weights = _random_weights(1, n_vocab, TinyShape(), seed=5)
    weights["output.weight"][-100:] *= 50.0  # the extra ids win the argmax almost everywhere
    path = _write(tmp_path / "wide-draft.gguf", weights, 1, TinyShape(), "f32", "extended", "wide")
    target = LlamaCppEngine(tiny_family.target, n_ctx=256, n_batch=64)
    wide = LlamaCppEngine(path, n_ctx=256, n_batch=64)
    try:
        assert wide.n_vocab == target.n_vocab + 100
        prompt = target.tokenize("the model is fast and the draft is")
        reference = plain_reference(target, prompt, 24)
        for temperature in (0.0, 0.8):
            result = SpeculativeDecoder(target, AutoregressiveDrafter(wide), num_draft_tokens=4, adaptive=False).generate(
                prompt, 24, SamplingParams(temperature=temperature, seed=1))
            assert len(result.tokens) == 24
            if temperature == 0.0:
                assert_matches_plain(result.tokens, reference, strict=strict_identity(target))
    finally:
        target.close()
        wide.close()


def test_importing_the_llama_package_has_no_side_effect():
    """llama.cpp's log sink and backends are set up by the first engine, not by an import."""
    code = ("import specdec_gguf.engines.llama_cpp as p, specdec_gguf.engines.llama_cpp.runtime as r; "
            "print(r._initialised)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_log_capture_is_per_engine(tiny_family):
    """Lines llama.cpp logs while one engine loads don't land in another engine's capture."""
    from specdec_gguf.engines import LlamaCppEngine

    first = LlamaCppEngine(tiny_family.target, n_ctx=64, n_batch=8)
    lines_before = list(first.log.lines)
    second = LlamaCppEngine(tiny_family.draft, n_ctx=64, n_batch=8)
    try:
        assert list(first.log.lines) == lines_before
        assert second.log.lines  # llama.cpp does log while loading
    finally:
        first.close()
        second.close()
