"""Bad input gets a clear SpecDecError subclass naming the value; stops and context end."""

from __future__ import annotations

import pytest

from specdec_gguf import (ConfigError, ContextOverflowError, EngineError, SamplingParams,
                          SpeculativeDecoder)
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine


@pytest.mark.parametrize("k", [0, -1, 513])
def test_k_out_of_range(target, k):
    with pytest.raises(ConfigError, match=rf"num_draft_tokens={k}.*\[1, n_ctx=512\]"):
        SpeculativeDecoder(target, PromptLookupDrafter(), num_draft_tokens=k, adaptive=False)


def test_empty_prompt(target):
    with pytest.raises(ConfigError, match="empty"):
        SpeculativeDecoder(target).generate([], 5)


def test_prompt_longer_than_context(target):
    with pytest.raises(ContextOverflowError, match="512 tokens.*n_ctx=512"):
        SpeculativeDecoder(target).generate([1] * 512, 5)


@pytest.mark.parametrize("n", [0, -5])
def test_max_new_tokens(target, n):
    with pytest.raises(ConfigError, match=f"max_new_tokens={n}"):
        SpeculativeDecoder(target).generate([1], n)


def test_token_outside_vocab(target):
    with pytest.raises(ConfigError, match="40.*outside the vocabulary"):
        SpeculativeDecoder(target).generate([1, 40], 5)


def test_negative_temperature_and_bad_top_p():
    with pytest.raises(ConfigError, match="temperature=-1"):
        SamplingParams(temperature=-1)
    with pytest.raises(ConfigError, match=r"top_p=0.*\(0, 1\]"):
        SamplingParams(temperature=1.0, top_p=0)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_context_end_stops_cleanly_and_shrinks_k(k):
    target = InMemoryEngine.random(30, seed=1, n_ctx=40)
    drafter = AutoregressiveDrafter(target.perturbed(0.0, seed=0, n_ctx=40))
    result = SpeculativeDecoder(target, drafter, num_draft_tokens=k, adaptive=False).generate([1, 2, 3], 1000)
    assert result.stop_reason == "context"
    assert len(result.tokens) == 40 - 3
    reference = SpeculativeDecoder(target).generate([1, 2, 3], 1000)
    assert reference.tokens == result.tokens


def test_stop_tokens_and_eog():
    target = InMemoryEngine.random(30, seed=2)
    reference = SpeculativeDecoder(target).generate([1], 40).tokens
    stop = reference[10]
    first = reference.index(stop)
    decoder = SpeculativeDecoder(target, AutoregressiveDrafter(target.perturbed(0.1, seed=3)), num_draft_tokens=6, adaptive=False)
    result = decoder.generate([1], 40, stop_token_ids=[stop])
    assert result.stop_reason == "stop_token"
    assert result.tokens == reference[:first]
    assert target.n_past == 1 + len(result.tokens) - 1  # the stop token is not kept in the cache
    eog_target = InMemoryEngine.random(30, seed=2, eog_token_ids=[stop])
    assert SpeculativeDecoder(eog_target).generate([1], 40).stop_reason == "eog"


def test_engine_fault_mid_round_leaves_engines_consistent_and_retry_works(target, draft):
    decoder = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False)
    expected = decoder.generate([1, 2], 30).tokens
    for engine in (target, draft):
        for call in range(0, 12):
            engine.calls = 0
            engine.fail_at_call = call
            try:
                out = decoder.generate([1, 2], 30).tokens
            except EngineError as err:
                assert "injected fault" in str(err)
                assert target.n_past <= len(target.tokens)
                assert list(target.tokens) == ([1, 2] + expected)[: target.n_past]
                assert list(draft.tokens) == ([1, 2] + expected)[: draft.n_past]
            else:
                assert out == expected  # the fault index lay beyond this run's calls
            engine.fail_at_call = None
            assert decoder.generate([1, 2], 30).tokens == expected


def test_tree_proposal_is_refused_not_verified_as_a_chain(target):
    from specdec_gguf import DraftProposal, SpecDecError
    from specdec_gguf.engine import DrafterBase

    class TreeDrafter(DrafterBase):
        name = "tree"

        def start(self, prompt_tokens):
            pass

        def propose(self, max_tokens, policy, rng, budget=None):
            return DraftProposal(tokens=(1, 2, 3), parents=(-1, -1, 0))  # two siblings: a tree

        def accept(self, n_accepted, committed):
            pass

        def rollback(self):
            pass

    decoder = SpeculativeDecoder(target, TreeDrafter(), num_draft_tokens=3, adaptive=False)
    with pytest.raises(SpecDecError, match="tree"):
        decoder.generate([1, 2], 5)
    assert target.n_past <= 1  # rolled back to the committed context
    assert DraftProposal(tokens=(1, 2), parents=(-1, 0)).is_linear
