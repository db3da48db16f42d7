"""Greedy speculative decoding reproduces target-only greedy decoding exactly."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.schedule import FixedSchedule


def plain_greedy(engine: InMemoryEngine, prompt: list[int], n: int) -> list[int]:
    """Reference: one token at a time straight from the engine's logits table, no decoder."""
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(int(engine.logits_for(ctx).argmax()))
    return ctx[len(prompt):]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab=st.integers(4, 48), seed=st.integers(0, 10_000), noise=st.floats(0.0, 2.0),
       k=st.integers(1, 16), use_model=st.booleans(), adaptive=st.booleans(),
       prompt=st.lists(st.integers(0, 3), min_size=1, max_size=8), max_new=st.integers(1, 40))
def test_greedy_speculative_equals_target_greedy(vocab, seed, noise, k, use_model, adaptive, prompt, max_new):
    target = InMemoryEngine.random(vocab, seed=seed, n_ctx=256)
    draft_engine = target.perturbed(noise, seed=seed + 1)
    drafter = AutoregressiveDrafter(draft_engine) if use_model else PromptLookupDrafter(max_ngram=3)
    decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=k, adaptive=adaptive)
    out: list[int] = []
    for event in decoder.stream(prompt, max_new):
        out.extend(event.tokens)
        # The anchor (last committed token) is the one committed token not yet in the cache.
        assert target.n_past == len(prompt) + len(out) - 1
        assert list(target.tokens) == (prompt + out)[:-1]
        # The drafter follows the committed context, a pause behind at most: a pause's plain rounds are
        # told to it together when the pause ends (or the generation does).
        told = list(drafter.context)
        assert told == (prompt + out)[:len(told)] and len(prompt + out) - len(told) <= 64
        if use_model:
            view = list(drafter.cache_view)
            assert view == told[len(told) - len(view):]
            assert list(draft_engine.tokens) == view[: draft_engine.n_past]
            assert draft_engine.n_past <= len(view) - 1
    assert out == plain_greedy(target, prompt, max_new)
    assert list(drafter.context) == prompt + out  # (all told when the generation stopped)


def test_plain_decoder_matches_reference(target):
    result = SpeculativeDecoder(target).generate([1, 2], 30)
    assert result.tokens == plain_greedy(target, [1, 2], 30)
    assert result.stats.target_passes == 30
    assert result.stats.tokens_per_target_pass == 1.0
    assert result.stop_reason == "length"


def test_draft_equal_to_target_accepts_everything(target):
    k = 5
    twin = target.perturbed(0.0, seed=0)
    result = SpeculativeDecoder(target, AutoregressiveDrafter(twin), num_draft_tokens=k, adaptive=False).generate([3], 62)
    assert result.stats.acceptance_rate == 1.0
    # 62 = 10 * (k + 1) + 2: ten full rounds of k accepted + 1 bonus, then a round clipped to
    # 1 drafted token (accepted) + 1 bonus by max_new_tokens.
    assert result.stats.target_passes == 11
    assert result.stats.accepted_length_histogram == [0, 1, 0, 0, 0, 10]
    assert result.stats.tokens_per_target_pass == 62 / 11
    assert result.tokens == plain_greedy(target, [3], 62)


def test_worse_draft_accepts_less(target):
    prompt = [1, 2, 3]
    rates = []
    for noise in (0.1, 1.0, 4.0):
        drafter = AutoregressiveDrafter(target.perturbed(noise, seed=5))
        rates.append(SpeculativeDecoder(target, drafter, num_draft_tokens=4, adaptive=False).generate(prompt, 80)
                     .stats.acceptance_rate)
    assert rates[0] > rates[1] > rates[2]


def test_origins_label_each_token(target, draft):
    decoder = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=4, adaptive=False)
    seen = set()
    for event in decoder.stream([5], 60):
        assert len(event.origins) == len(event.tokens)
        seen.update(event.origins)
        drafted_last = event.origins[-1]
        assert drafted_last in {"correction", "bonus", "target"} or event.stop_reason
    assert {"accepted", "correction"} <= seen


def test_decoders_sharing_a_target_never_reuse_a_stale_prefix(target, draft):
    """Prefix reuse reads the engine's own cache record, so other decoders can't mislead it."""
    a = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=3, adaptive=False)
    b = SpeculativeDecoder(target, PromptLookupDrafter(), num_draft_tokens=3, adaptive=False)
    a.generate([1, 2, 3, 4], 10)
    b.generate([5, 6, 7, 8], 10)  # same length: a length check alone would be fooled
    assert a.generate([1, 2, 3, 9], 10).tokens == plain_greedy(target, [1, 2, 3, 9], 10)
    assert b.generate([5, 6, 7, 8, 1], 10).tokens == plain_greedy(target, [5, 6, 7, 8, 1], 10)


class ScriptedSchedule(FixedSchedule):
    """Drafts according to a fixed list of k values, then plain steps."""

    def __init__(self, ks):
        super().__init__(1)
        self.ks = list(ks)

    def next_k(self, room):
        return self.ks.pop(0) if self.ks else 0


def test_draft_restarts_on_recent_window_after_long_plain_stretch(target):
    draft = target.perturbed(0.0, seed=0)  # agrees with the target: every draft is accepted
    drafter = AutoregressiveDrafter(draft, max_catch_up=4)
    decoder = SpeculativeDecoder(target, drafter, schedule=ScriptedSchedule([2] + [0] * 20 + [3, 3]))
    result = decoder.generate([1, 2, 3], 40)
    assert result.tokens == plain_greedy(target, [1, 2, 3], 40)
    # the draft did not process the 20 skipped tokens: its cache follows a short recent window
    assert len(drafter.cache_view) < len(drafter.context) - 15
    assert list(draft.tokens) == list(drafter.cache_view[: draft.n_past])
    assert result.stats.accepted_length_histogram[3] >= 1  # drafting from the window still works


def test_draft_with_smaller_context_keeps_drafting_past_its_end(target):
    draft = target.perturbed(0.0, seed=0, n_ctx=24)  # the target has 512
    drafter = AutoregressiveDrafter(draft)
    result = SpeculativeDecoder(target, drafter, num_draft_tokens=4, adaptive=False).generate([1, 2, 3], 100)
    assert result.tokens == plain_greedy(target, [1, 2, 3], 100)
    assert draft.n_past <= 24
    late_rounds = result.stats.drafted
    assert late_rounds > 60  # it drafted all along, not only while the first 24 tokens fit
