"""LlamaCppEngine on tiny random GGUF models: logits, rollback, exact greedy speculation."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_gguf import SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.tiny import TinyShape, write_tiny_family

from gguf_edit import file_type as gguf_file_type, matrix_types
from identity import assert_matches_plain, plain_reference, strict_identity

PROMPT_TEXT = "the model is fast and the draft is not, but the target"
# Batched and one-token passes use different kernels; on these F32 models logits stay this close.
LOGIT_ATOL = 5e-3


def test_batched_logits_match_one_token_logits(tiny_engines):
    target, _ = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    target.reset(0)
    batched = target.forward_logits(prompt).copy()  # [n, V]
    target.reset(0)
    single = np.stack([target.forward_logits([t])[0].copy() for t in prompt])
    assert batched.shape == (len(prompt), target.n_vocab)
    np.testing.assert_allclose(batched, single, atol=LOGIT_ATOL, rtol=0)
    target.reset(0)
    assert target.forward_argmax(prompt).tolist() == batched.argmax(axis=1).tolist()


def test_reset_then_reforward_reproduces_logits(tiny_engines):
    target, _ = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    target.reset(0)
    target.advance(prompt[:5])
    first = target.forward_logits(prompt[5:]).copy()
    assert target.n_past == len(prompt)
    target.reset(5)
    assert target.n_past == 5
    again = target.forward_logits(prompt[5:])
    np.testing.assert_allclose(again, first, atol=1e-6)


def test_chunked_prompt_longer_than_n_batch(tiny_family):
    with LlamaCppEngine(tiny_family.target, n_ctx=256, n_batch=16) as engine:
        prompt = engine.tokenize(PROMPT_TEXT * 3)
        assert len(prompt) > 2 * 16
        engine.advance(prompt[:-1])
        assert engine.n_past == len(prompt) - 1
        tail = engine.forward_logits(prompt[-1:]).copy()
        engine.reset(0)
        whole = engine.forward_logits(prompt)  # a logits pass longer than n_batch, chunked
        assert whole.shape == (len(prompt), engine.n_vocab)
        np.testing.assert_allclose(whole[-1], tail[0], atol=LOGIT_ATOL)
        assert engine.tokens.tolist() == prompt


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup"])
def test_greedy_speculative_matches_plain_up_to_near_ties(tiny_engines, k, kind):
    """Speculative output equals plain decoding up to plain decoding's first near-tie (all of it
    where exact mode says the build is invariant): see identity.py for why not further.

    Fails with greedy_accept accepting one more drafted token than matched
    (test_identity_check_catches_a_wrong_accept)."""
    target, draft = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    reference = plain_reference(target, prompt, 60)
    drafter = AutoregressiveDrafter(draft) if kind == "draft-model" else PromptLookupDrafter()
    result = SpeculativeDecoder(target, drafter, num_draft_tokens=k, adaptive=False).generate(prompt, 60)
    assert_matches_plain(result.tokens, reference, strict=strict_identity(target))
    assert result.stats.drafted > 0
    assert target.n_past == len(prompt) + len(result.tokens) - 1


def test_plain_decoder_is_the_reference(tiny_engines):
    """The decoder's plain path (no drafter) makes the same one-token passes as plain_reference."""
    target, _ = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    reference = plain_reference(target, prompt, 60)
    target.reset(0)  # no prefix reuse: the same prefill as the reference
    assert SpeculativeDecoder(target).generate(prompt, 60).tokens == reference.tokens


def test_identity_check_catches_a_wrong_accept(tiny_engines, monkeypatch):
    """The identity helper can fail: a greedy verifier that accepts one mismatched token."""
    import specdec_gguf.sampling as sampling_module

    real = sampling_module.greedy_accept

    def accepts_one_more(draft_tokens, target_argmax):
        n, _ = real(draft_tokens, target_argmax)
        n = min(n + 1, len(draft_tokens))
        return n, int(target_argmax[n])

    monkeypatch.setattr(sampling_module, "greedy_accept", accepts_one_more)
    target, draft = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    reference = plain_reference(target, prompt, 60)
    result = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False).generate(
        prompt, 60)
    with pytest.raises(AssertionError, match="differs from plain decoding"):
        assert_matches_plain(result.tokens, reference)


def test_checkpoint_rollback_decodes_like_seq_rm(tiny_family):
    """Speculative decoding over a checkpoint-rollback target matches plain decoding (up to near-ties)."""
    with LlamaCppEngine(tiny_family.target, n_ctx=256, rollback="checkpoint") as ckpt, \
            LlamaCppEngine(tiny_family.target, n_ctx=256) as cut, \
            LlamaCppEngine(tiny_family.draft, n_ctx=256) as draft:
        assert (ckpt.rollback_mode, cut.rollback_mode) == ("checkpoint", "seq_rm")
        prompt = cut.tokenize(PROMPT_TEXT)
        reference = plain_reference(cut, prompt, 40)
        got = SpeculativeDecoder(ckpt, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False).generate(prompt, 40)
        assert got.stats.accepted > 0 and got.stats.accepted < got.stats.drafted  # rollbacks happened
        assert_matches_plain(got.tokens, reference, strict=strict_identity(ckpt))


def probe_matches_fresh_engine(engine, fresh, probe: int) -> None:
    """The model's cache, not the Python-side record: the next pass's logits equal those of a
    fresh engine fed the committed tokens (``engine.tokens``) and the same probe token."""
    committed = [int(t) for t in engine.tokens]
    got = engine.forward_logits([probe])[0].copy()
    engine.reset(len(committed))
    fresh.reset(0)
    fresh.advance(committed)
    want = fresh.forward_logits([probe])[0]
    np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0)  # a wrong cache differs by ~1


def rollback_script(engine, fresh, prompt: list[int], other: list[int]) -> None:
    """Rollbacks the decoder makes, and one it makes between generations, each checked on the cache."""
    probe = prompt[3]
    engine.reset(0)
    engine.advance(prompt[:10])
    engine.forward_logits(prompt[10:15])  # verify 5, keep 2
    engine.reset(12)
    probe_matches_fresh_engine(engine, fresh, probe)
    engine.forward_logits(prompt[12:16])  # verify 4, keep none
    engine.reset(12)
    probe_matches_fresh_engine(engine, fresh, probe)
    # A new generation whose prompt differs after token 4 but has the same length:
    # the cache must hold the new tokens, not a state saved for the old ones.
    engine.reset(4)
    engine.advance(other[4:12])
    engine.forward_logits(other[12:15])
    engine.reset(12)
    assert [int(t) for t in engine.tokens] == other[:12]
    probe_matches_fresh_engine(engine, fresh, probe)


@pytest.mark.parametrize("mode", ["checkpoint", "seq_rm"])
def test_rollback_leaves_the_model_cache_at_the_committed_tokens(tiny_engines, tiny_family, mode):
    """Fails with a checkpoint that is not invalidated when the cache is cut below it
    (test_stale_checkpoint_is_caught): the Python-side record is right, the cache is not."""
    fresh, _ = tiny_engines
    prompt = fresh.tokenize(PROMPT_TEXT)
    other = prompt[:4] + fresh.tokenize("data token and more words for the other prompt", add_bos=False)
    with LlamaCppEngine(tiny_family.target, n_ctx=256, rollback=mode) as engine:
        rollback_script(engine, fresh, prompt, other)


def test_stale_checkpoint_is_caught(tiny_engines, tiny_family, monkeypatch):
    """The cache check can fail: a checkpoint kept after the cache was cut below it is later
    restored for other tokens of the same length (llama.cpp sees consistent positions)."""
    from specdec_gguf.engines.llama_cpp.checkpoint import StateCheckpoint

    real = StateCheckpoint.restore

    def forgets_to_invalidate(self, ctx, memory, n_past):
        saved_at = self.n_past
        restored = real(self, ctx, memory, n_past)
        self.n_past = saved_at  # the bug: still claims to hold the state at saved_at
        return restored

    monkeypatch.setattr(StateCheckpoint, "restore", forgets_to_invalidate)
    fresh, _ = tiny_engines
    prompt = fresh.tokenize(PROMPT_TEXT)
    other = prompt[:4] + fresh.tokenize("data token and more words for the other prompt", add_bos=False)
    with LlamaCppEngine(tiny_family.target, n_ctx=256, rollback="checkpoint") as engine:
        with pytest.raises(AssertionError, match="Not equal to tolerance"):
            rollback_script(engine, fresh, prompt, other)


def test_seeded_sampling_is_reproducible(tiny_engines):
    target, draft = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    decoder = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=7)
    a = decoder.generate(prompt, 40, params)
    b = decoder.generate(prompt, 40, params)
    assert a.tokens == b.tokens
    assert decoder.generate(prompt, 40, SamplingParams(temperature=0.8, seed=8)).tokens != a.tokens


def test_tokenize_detokenize_round_trip(tiny_engines):
    target, _ = tiny_engines
    tokens = target.tokenize("the draft was fast")
    assert tokens[0] == target.bos_token
    assert target.detokenize(tokens[1:]).strip() == "the draft was fast"
    assert target.tokenize("x", add_bos=False)[0] != target.bos_token
    assert target.is_eog(target.eos_token) and not target.is_eog(tokens[1])


def test_quantized_family_loads_and_speculates(tmp_path):
    from specdec_gguf.tiny import write_tiny_family

    family = write_tiny_family(tmp_path, dtype="q8_0")
    with LlamaCppEngine(family.target, n_ctx=256) as target, LlamaCppEngine(family.draft, n_ctx=256) as draft:
        prompt = target.tokenize(PROMPT_TEXT)
        result = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False).generate(prompt, 40)
        assert len(result.tokens) == 40
        assert result.stats.accepted > 0


def test_forward_last_asks_one_row_and_matches_full_pass(tiny_engines):
    target, _ = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    target.reset(0)
    full = target.forward_logits(prompt)[-1].copy()
    target.reset(0)
    last = target.forward_last_logits(prompt)
    assert last.shape == (target.n_vocab,)
    np.testing.assert_allclose(last, full, atol=LOGIT_ATOL)
    assert target.n_past == len(prompt)
    target.reset(0)
    assert target.forward_last_argmax(prompt) == int(full.argmax())


def test_devices_by_name(tiny_family):
    from specdec_gguf import EngineError

    with LlamaCppEngine(tiny_family.target, n_ctx=64, devices=["CPU"]) as engine:
        assert engine.forward_argmax([1, 2]).shape == (2,)
    with pytest.raises(EngineError, match=r"device 'NOPE0' is not in this build \(devices: .*CPU"):
        LlamaCppEngine(tiny_family.target, n_ctx=64, devices=["NOPE0"])


def test_rpc_needs_an_rpc_build(tiny_family):
    from specdec_gguf import EngineError
    from specdec_gguf.engines.llama_cpp import backend_report

    if backend_report()["rpc"]:
        pytest.skip("this build has RPC; the refusal path is for builds without it")
    with pytest.raises(EngineError, match="no RPC backend; rebuild it with"):
        LlamaCppEngine(tiny_family.target, n_ctx=64, rpc_servers=["127.0.0.1:50052"])


@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup"])
def test_generation_reaching_n_ctx_stops_cleanly(tiny_family, kind):
    with LlamaCppEngine(tiny_family.target, n_ctx=256) as target, \
            LlamaCppEngine(tiny_family.draft, n_ctx=256) as draft:
        prompt = target.tokenize(PROMPT_TEXT)
        drafter = AutoregressiveDrafter(draft) if kind == "draft-model" else PromptLookupDrafter()
        result = SpeculativeDecoder(target, drafter, num_draft_tokens=8, adaptive=False).generate(prompt, 10_000, ignore_eog=True)
        assert result.stop_reason == "context"
        assert len(prompt) + len(result.tokens) == target.n_ctx
        plain = SpeculativeDecoder(target).generate(prompt, 10_000, ignore_eog=True)
        assert plain.stop_reason == "context" and len(plain.tokens) == len(result.tokens)


@pytest.mark.parametrize("amx, opt_in, allowed", [(False, None, True), (True, None, False), (True, "1", True),
                                                  (True, "yes", False)])
def test_extra_weight_buffers_stay_off_in_a_build_with_amx_kernels(monkeypatch, tiny_family, amx, opt_in, allowed):
    """llama.cpp's AMX kernels crash on some machines that report AMX (Gemma and every quantized tiny model
    crashed in their first batched pass on a 2-core Sapphire Rapids VM): the engine, the llama-cpp-python
    peer and the llama.cpp peer keep weights in the plain layout there unless SPECDEC_LLAMA_AMX=1."""
    import llama_cpp as lc

    from specdec_gguf.engines.llama_cpp import backends
    from specdec_gguf.peers import LlamaCppPeer

    real = lc.llama_print_system_info().decode()
    info = real.replace("AMX_INT8 = 1", "") + (" AMX_INT8 = 1 |" if amx else "")
    monkeypatch.setattr(lc, "llama_print_system_info", lambda: info.encode())
    if opt_in is None:
        monkeypatch.delenv(backends.AMX_OPT_IN, raising=False)
    else:
        monkeypatch.setenv(backends.AMX_OPT_IN, opt_in)
    assert backends.has_amx_kernels() is amx
    assert backends.extra_buffers_allowed() is allowed
    peer = LlamaCppPeer(tiny_family.target, tiny_family.target, "ngram-simple")  # the layout our engines get
    assert ("--no-repack" in peer.command("x", 4)) is not allowed
    assert "--no-repack" not in LlamaCppPeer(tiny_family.target, tiny_family.target, "ngram-simple",
                                             repack=True).command("x", 4)
    # (An F32 model: AMX buffers never hold its weights, so loading it here is safe either way.)
    with LlamaCppEngine(tiny_family.target, n_ctx=64) as engine:
        assert engine.extra_buffers is allowed
    with LlamaCppEngine(tiny_family.target, n_ctx=64, exact="warn") as engine:
        assert engine.extra_buffers is False  # exact mode never repacks (bit-invariance)


def test_the_llama_cpp_python_peer_prefills_each_prompt_afresh(tiny_family):
    """Each peer trial evaluates its whole prompt, as each of our cold trials does: llama-cpp-python reuses
    the prompt it still holds, and a generation that skips the prefill skips its after-effects too (on
    a tiny model 4-5% of a 64-token answer). Negative control: its own generate, called again on the
    same prompt, evaluates only the prompt's last token."""
    from specdec_gguf.engines.llama_cpp.peer import PeerPromptLookup

    peer = PeerPromptLookup(tiny_family.target, n_ctx=256, n_threads=1)
    try:
        llm, evaluated = peer._llm, []
        eval_ = llm.eval
        llm.eval = lambda tokens: (evaluated.append(len(tokens)), eval_(tokens))[1]
        prompt = llm.tokenize(PROMPT_TEXT.encode())
        for _ in range(2):
            evaluated.clear()
            tokens, _ = peer.generate(prompt, 4)
            assert len(tokens) == 4 and evaluated[0] == len(prompt)
        evaluated.clear()
        next(llm.generate(prompt, temp=0.0, top_k=1, reset=True))
        assert evaluated[0] < len(prompt)  # (what a trial without the reset would have done)
    finally:
        peer.close()


@pytest.mark.parametrize("file_type, tensor_type, ftype", [("f16", "F16", 1), ("q8_0", "Q8_0", 7)])
def test_requantize_writes_the_type_asked_and_the_result_decodes(tiny_family, tmp_path, file_type, tensor_type, ftype):
    from specdec_gguf.engines.llama_cpp import requantize

    dest = requantize(tiny_family.target, tmp_path / f"t-{file_type}.gguf", file_type, threads=1)
    assert gguf_file_type(dest) == ftype
    matrices = matrix_types(dest)
    assert matrices and set(matrices.values()) == {tensor_type}, matrices
    assert sorted(tmp_path.iterdir()) == [dest]  # no temporary file left beside it
    with LlamaCppEngine(dest, n_ctx=256, n_threads=1) as target:
        prompt = target.tokenize(PROMPT_TEXT)
        assert len(SpeculativeDecoder(target, PromptLookupDrafter()).generate(prompt, 24).tokens) == 24


def test_requantize_to_q4_k_m_falls_back_where_rows_do_not_fit(tmp_path):
    """Q4_K packs rows in blocks of 256: a 256-wide model's matrices take it, a 64-wide one's fall back."""
    from specdec_gguf.engines.llama_cpp import requantize

    wide = write_tiny_family(tmp_path / "wide", target_layers=2, shape=TinyShape(n_embd=256, n_head=4, n_ff=512))
    for source, k_quants in ((wide.target, True), (write_tiny_family(tmp_path / "narrow").target, False)):
        dest = requantize(source, tmp_path / f"{source.parent.name}-q4km.gguf", "q4_k_m", threads=1)
        assert gguf_file_type(dest) == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        matrices = matrix_types(dest)
        assert ("Q4_K" in matrices.values()) == k_quants, matrices
        assert "F32" not in matrices.values(), matrices
        with LlamaCppEngine(dest, n_ctx=256, n_threads=1) as target:
            prompt = target.tokenize(PROMPT_TEXT)
            assert len(SpeculativeDecoder(target, PromptLookupDrafter()).generate(prompt, 16).tokens) == 16


def test_requantize_names_what_is_wrong(tiny_family, tmp_path):
    from specdec_gguf.engines.llama_cpp import requantize
    from specdec_gguf.errors import ConfigError, EngineError

    with pytest.raises(ConfigError, match="'q3_k'.*f16, q8_0, q4_0"):
        requantize(tiny_family.target, tmp_path / "x.gguf", "q3_k")
    with pytest.raises(ConfigError, match="no GGUF file"):
        requantize(tmp_path / "missing.gguf", tmp_path / "x.gguf", "f16")
    with pytest.raises(ConfigError, match="threads=0"):
        requantize(tiny_family.target, tmp_path / "x.gguf", "f16", threads=0)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(EngineError, match="could not quantize"):
        requantize(broken, tmp_path / "x.gguf", "f16", threads=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.gguf"]  # nothing written, nothing left


def test_tiny_models_with_grouped_query_attention(tmp_path):
    """``TinyShape(n_head_kv=)`` writes fewer key/value heads (the shape most released models have); the
    family loads and speculates exactly, and the default (as many as query heads) writes the same file as before."""
    import gguf

    from specdec_gguf.errors import ConfigError
    from specdec_gguf.tiny import write_tiny_model

    family = write_tiny_family(tmp_path / "gqa", target_layers=2, shape=TinyShape(n_head=4, n_head_kv=1))
    reader = gguf.GGUFReader(str(family.target))
    assert int(reader.fields["llama.attention.head_count_kv"].parts[-1][0]) == 1
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    assert shapes["blk.0.attn_k.weight"] == (64, 16) and shapes["blk.0.attn_q.weight"] == (64, 64)  # one head of 16
    with LlamaCppEngine(family.target, n_ctx=256, n_threads=1) as target, \
            LlamaCppEngine(family.draft, n_ctx=256, n_threads=1) as draft:
        prompt = target.tokenize(PROMPT_TEXT)
        reference = plain_reference(target, prompt, 24)
        out = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False).generate(
            prompt, 24)
        assert_matches_plain(out.tokens, reference, strict=strict_identity(target))
        assert out.stats.accepted > 0  # (the draft's greedy tokens were the target's often enough to count)

    same = write_tiny_model(tmp_path / "explicit.gguf", shape=TinyShape(n_head_kv=4))
    assert same.read_bytes() == write_tiny_model(tmp_path / "default.gguf").read_bytes()
    with pytest.raises(ConfigError, match="n_head_kv=3 must divide n_head=4"):
        TinyShape(n_head_kv=3)
    with pytest.raises(ConfigError, match="n_embd=66 must be a multiple of n_head=4"):
        TinyShape(n_embd=66)
