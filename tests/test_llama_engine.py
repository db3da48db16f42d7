"""LlamaCppEngine on tiny random GGUF models: logits, rollback, exact greedy speculation."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_gguf import SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import LlamaCppEngine

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


def plain_tokens(target, prompt, n=60):
    return SpeculativeDecoder(target).generate(prompt, n).tokens


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["draft-model", "prompt-lookup"])
def test_greedy_speculative_identical_to_plain_on_f32(tiny_engines, k, kind):
    target, draft = tiny_engines
    prompt = target.tokenize(PROMPT_TEXT)
    expected = plain_tokens(target, prompt)
    drafter = AutoregressiveDrafter(draft) if kind == "draft-model" else PromptLookupDrafter()
    result = SpeculativeDecoder(target, drafter, num_draft_tokens=k, adaptive=False).generate(prompt, 60)
    assert result.tokens == expected
    assert result.stats.drafted > 0
    assert target.n_past == len(prompt) + len(result.tokens) - 1


def test_checkpoint_rollback_matches_seq_rm(tiny_family):
    with LlamaCppEngine(tiny_family.target, n_ctx=256, rollback="checkpoint") as ckpt, \
            LlamaCppEngine(tiny_family.target, n_ctx=256) as cut, \
            LlamaCppEngine(tiny_family.draft, n_ctx=256) as draft:
        assert (ckpt.rollback_mode, cut.rollback_mode) == ("checkpoint", "seq_rm")
        prompt = cut.tokenize(PROMPT_TEXT)
        expected = SpeculativeDecoder(cut, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False).generate(prompt, 40)
        got = SpeculativeDecoder(ckpt, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False).generate(prompt, 40)
        assert got.tokens == expected.tokens
        assert got.stats.acceptance_rate == expected.stats.acceptance_rate
        # A rollback past the checkpoint replays from the start.
        ckpt.reset(3)
        assert ckpt.tokens.tolist() == prompt[:3]


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
