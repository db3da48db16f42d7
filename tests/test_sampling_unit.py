"""sampling.py on hand-made vectors."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_gguf import ConfigError, SamplingParams, SpecDecError
from specdec_gguf.sampling import (greedy_accept, probs_from_logits, rejection_sample, residual_probs,
                                   sample, sample_declined, verify_declined)

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))


def test_temperature_one_is_softmax():
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0))
    np.testing.assert_allclose(probs, [0.5, 0.2, 0.15, 0.1, 0.05], rtol=1e-6)  # float32


def test_greedy_is_one_hot_argmax():
    probs = probs_from_logits(np.array([0.1, 3.0, 2.9]), SamplingParams())
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_low_temperature_sharpens():
    cold = probs_from_logits(LOGITS, SamplingParams(temperature=0.5))
    squared = np.array([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    np.testing.assert_allclose(cold, squared / squared.sum(), rtol=1e-6)


def test_top_k_keeps_k_best():
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(probs, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], rtol=1e-6)


@pytest.mark.parametrize("top_p, kept", [(0.5, 1), (0.6, 2), (0.7, 2), (0.71, 3), (0.95, 4), (1.0, 5)])
def test_top_p_keeps_smallest_set_reaching_mass(top_p, kept):
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
    assert np.count_nonzero(probs) == kept
    assert probs[:kept].sum() == pytest.approx(1.0, rel=1e-6)


def test_top_p_on_large_vocab_uses_growing_partial_sort():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(5000)
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.9))
    full = np.exp(logits - logits.max())
    full /= full.sum()
    order = np.argsort(-full)
    n = int(np.searchsorted(np.cumsum(full[order]), 0.9)) + 1
    assert set(np.flatnonzero(probs)) == set(order[:n])
    assert n > 64  # the first partial sort was not enough


def test_min_p_drops_tokens_below_share_of_max():
    probs = probs_from_logits(LOGITS, SamplingParams(temperature=1.0, min_p=0.25))
    # 0.25 * 0.5 = 0.125: keeps 0.5, 0.2, 0.15
    np.testing.assert_allclose(probs, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], rtol=1e-6)


def test_top_k_on_large_vocab_matches_full_partial_sort():
    from specdec_gguf.sampling import _top_indices

    rng = np.random.default_rng(3)
    values = rng.standard_normal(100_000).astype(np.float32)
    for k in (1, 7, 64, 1500, 5000):
        assert set(_top_indices(values, k)) == set(np.argsort(-values)[:k])


def test_sample_on_large_vocab_never_picks_impossible_tokens():
    rng = np.random.default_rng(2)
    probs = np.zeros(262_144, dtype=np.float32)
    probs[[5, 70_000, 262_143]] = [0.2, 0.5, 0.3]
    draws = np.bincount([sample(probs, rng) for _ in range(20_000)], minlength=len(probs))
    assert draws.sum() == draws[5] + draws[70_000] + draws[262_143]
    np.testing.assert_allclose(draws[[5, 70_000, 262_143]] / 20_000, [0.2, 0.5, 0.3], atol=0.015)


def test_sample_follows_probabilities():
    rng = np.random.default_rng(1)
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=4) / 20000
    np.testing.assert_allclose(draws, probs, atol=0.015)
    assert draws[1] == 0


def test_residual_is_positive_part_of_difference():
    target_probs = np.array([0.5, 0.3, 0.2])
    draft_row = np.array([0.2, 0.6, 0.2])
    np.testing.assert_allclose(residual_probs(target_probs, draft_row, 1), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(residual_probs(target_probs, None, 0), [0.0, 0.6, 0.4])


@pytest.mark.parametrize("draft, argmax, expected", [
    ([], [7], (0, 7)),
    ([1, 2, 3], [1, 2, 3, 9], (3, 9)),
    ([1, 2, 3], [1, 5, 3, 9], (1, 5)),
    ([4], [0, 4], (0, 0)),
])
def test_greedy_accept(draft, argmax, expected):
    assert greedy_accept(draft, np.array(argmax)) == expected


def test_rejection_sample_accepts_when_target_agrees_fully():
    logits = np.log(np.array([[1e-9, 1.0, 1e-9], [1e-9, 1e-9, 1.0]]))
    rng = np.random.default_rng(0)
    assert rejection_sample([1], None, logits, SamplingParams(temperature=1.0), rng) == (1, 2)


def test_rejection_sample_rejects_token_target_never_makes():
    logits = np.log(np.array([[1.0, 1e-30, 1e-30], [1.0, 1e-30, 1e-30]]))
    rng = np.random.default_rng(0)
    assert rejection_sample([2], None, logits, SamplingParams(temperature=1.0, top_k=1), rng) == (0, 0)


def test_rejection_sample_reports_each_examined_tokens_chance_up_to_the_first_rejection():
    # Rows: p = [0.5, 0.5, 0] at the first slot (q(x=0) = 0.25: chance 1), p(x=1) = 0.2 against q 0.8 at the
    # second (chance 0.25), the third never 1: rejected for sure, so the fourth is never examined.
    p = np.array([[0.5, 0.5, 1e-30], [0.8, 0.2, 1e-30], [1.0, 1e-30, 1e-30], [1 / 3] * 3, [1 / 3] * 3])
    q = np.array([[0.25, 0.5, 0.25], [0.1, 0.8, 0.1], [0.2, 0.6, 0.2], [1 / 3] * 3])
    params = SamplingParams(temperature=1.0)
    for seed in range(20):
        chances: list[float] = []
        n_acc, _ = rejection_sample([0, 1, 1, 2], q, np.log(p), params, np.random.default_rng(seed), chances=chances)
        assert chances[:n_acc + 1] == pytest.approx([1.0, 0.25, 0.0][:n_acc + 1]) and len(chances) == n_acc + 1
        assert n_acc <= 2  # (the third token is always rejected)
    # What it reports changes no draw: the same seed decides alike with and without the list.
    assert [rejection_sample([0, 1, 1, 2], q, np.log(p), params, np.random.default_rng(s)) for s in range(20)] == \
        [rejection_sample([0, 1, 1, 2], q, np.log(p), params, np.random.default_rng(s), chances=[]) for s in range(20)]


@pytest.mark.parametrize("q, chance", [
    (None, 0.2),  # a deterministic drafter (prompt lookup): q(x) = 1, the chance is p(x)
    (np.array([0.1, 0.8, 0.05, 0.03, 0.02]), 0.25),  # a draft row: p(x) / q(x)
    (np.float32(0.1), 1.0),  # q(x) alone, below p(x): always accepted
    (np.float32(0.0), 1.0),  # q(x) 0 (a draft that proposed what it gives no mass): p(x) > 0 accepts
])
def test_a_declined_token_gets_its_acceptance_chance_and_the_step_samples_as_a_plain_one(q, chance):
    """Sampled, a proposal nobody verified still shows how right its first token was: the chance
    min(1, p(x)/q(x)) that speculative sampling would have accepted it. The step's token is drawn as
    a plain step draws it (same generator state, same token), so sampled output is unchanged. Fails
    if the chance ignored q, or the draw used the generator differently."""
    params = SamplingParams(temperature=1.0)
    for seed in range(20):
        _, plain = rejection_sample([], None, LOGITS[None, :], params, np.random.default_rng(seed))
        token, got = sample_declined(1, q, LOGITS, params, np.random.default_rng(seed))
        assert token == plain
        assert got == pytest.approx(chance, rel=1e-6)


def test_a_declined_token_the_target_never_makes_had_no_chance():
    """Under top-k 1 only the best token has mass: a declined token outside it would always have been
    rejected, whatever q says (rejection_sample's u·q(x) < p(x) with p(x) = 0)."""
    params = SamplingParams(temperature=1.0, top_k=1)
    for q in (None, np.float32(0.0), np.float32(0.3)):
        _, chance = sample_declined(1, q, LOGITS, params, np.random.default_rng(0))
        assert chance == 0.0
    assert rejection_sample([1], None, np.stack([LOGITS, LOGITS]), params, np.random.default_rng(0))[0] == 0


def test_rejection_without_full_draft_rows_raises():
    logits = np.log(np.array([[0.5, 0.5], [0.5, 0.5]]))
    rng = np.random.default_rng(0)
    with pytest.raises(SpecDecError, match="full rows"):
        for _ in range(50):  # q(x)=0.9 > p(x)=0.5: a rejection comes quickly
            rejection_sample([1], np.array([0.9]), logits, SamplingParams(temperature=1.0), rng)


@pytest.mark.parametrize("kwargs, name", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"min_p": 1.0}, "min_p"), ({"min_p": -0.1}, "min_p"), ({"seed": -3}, "seed"),
])
def test_bad_sampling_params_name_the_value(kwargs, name):
    with pytest.raises(ConfigError, match=name):
        SamplingParams(**kwargs)


def test_a_declined_drawn_token_is_verified_against_the_plain_row():
    """A drawn token the schedule declined is tested as speculative sampling tests it: kept with chance
    min(1, p(x)/q(x)), else the token comes from the residual (never x itself). Fails if the step drew
    from p (x would come back with chance p(x) = 0.2, not 0.25, and after rejections too)."""
    params = SamplingParams(temperature=1.0)
    q = np.array([0.1, 0.8, 0.05, 0.03, 0.02])
    kept = 0
    for seed in range(4000):
        token, chance = verify_declined(1, q, LOGITS, params, np.random.default_rng(seed))
        assert chance == pytest.approx(0.25, rel=1e-6)
        kept += token == 1
    assert abs(kept / 4000 - 0.25) < 4 * (0.25 * 0.75 / 4000) ** 0.5


def test_a_declined_drawn_token_without_its_row_cannot_be_rejected():
    with pytest.raises(SpecDecError, match="full rows"):
        for seed in range(50):  # q(x) = 0.9 > p(x) = 0.2: a rejection comes quickly
            verify_declined(1, np.float32(0.9), LOGITS, SamplingParams(temperature=1.0), np.random.default_rng(seed))
