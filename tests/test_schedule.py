"""The adaptive draft schedule: the cost model's choices and its probing."""

from __future__ import annotations

import pytest

from specdec_gguf import ConfigError
from specdec_gguf.schedule import AdaptiveSchedule, FixedSchedule


def feed(schedule: AdaptiveSchedule, rounds: int, verify, accept_prob_slots: int, draft_cost: float = 0.0):
    """Simulate rounds: verify(n) seconds per pass; the drafter's first `accept_prob_slots` tokens are right."""
    ks = []
    for _ in range(rounds):
        k = schedule.next_k()
        ks.append(k)
        schedule.observe(k, min(k, accept_prob_slots), draft_cost * k, verify(k + 1))
    return ks


def test_expected_tokens_is_leviathan_formula_for_constant_rate():
    schedule = AdaptiveSchedule(6)
    schedule.accept_rate = [0.7] * 6
    schedule._slot_count = [1] * 6
    for k in range(7):
        assert schedule.expected_tokens(k) == pytest.approx((1 - 0.7 ** (k + 1)) / (1 - 0.7))


def test_cheap_verify_and_perfect_drafts_draft_the_maximum():
    schedule = AdaptiveSchedule(8)
    ks = feed(schedule, 60, verify=lambda n: 1e-3 * (1 + 0.05 * (n - 1)), accept_prob_slots=100)
    assert ks[:2] == [0, 3]  # measure a plain pass, then a short probe
    assert ks[-20:] == [8] * 20 or set(ks[-20:]) <= {0, 8}


def test_expensive_verify_falls_back_to_plain_steps_with_rare_probes():
    schedule = AdaptiveSchedule(8)
    ks = feed(schedule, 400, verify=lambda n: 1e-3 * n, accept_prob_slots=0)
    tail = ks[50:]
    drafting = [k for k in tail if k]
    assert len(drafting) <= 8  # probes only, at doubling intervals
    assert tail.count(0) > 0.97 * len(tail)


def test_middle_ground_picks_interior_k():
    # verify(n) grows with n; drafts right for the first 3 slots only
    schedule = AdaptiveSchedule(8)
    ks = feed(schedule, 200, verify=lambda n: 1e-3 * (1 + 0.2 * (n - 1)), accept_prob_slots=3)
    assert max(set(ks[-50:]), key=ks[-50:].count) == 3


def test_draft_cost_counts():
    cheap, costly = AdaptiveSchedule(4), AdaptiveSchedule(4)
    v = lambda n: 1e-3 * (1 + 0.1 * (n - 1))  # noqa: E731
    a = feed(cheap, 100, v, accept_prob_slots=2, draft_cost=0.0)
    b = feed(costly, 100, v, accept_prob_slots=2, draft_cost=5e-3)
    assert sum(a[-30:]) > sum(b[-30:])
    assert b[-30:].count(0) >= 25


def test_bad_k():
    with pytest.raises(ConfigError):
        AdaptiveSchedule(0)
    with pytest.raises(ConfigError):
        FixedSchedule(0)
