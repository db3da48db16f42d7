"""SpecStats arithmetic."""

from __future__ import annotations

import pytest

from specdec_gguf import SpecStats


def test_record_round_and_derived_figures():
    stats = SpecStats()
    stats.record_round(drafted=4, accepted=4, generated=5)
    stats.record_round(drafted=4, accepted=1, generated=2)
    stats.record_round(drafted=0, accepted=0, generated=1)
    stats.record_round(drafted=2, accepted=0, generated=1)
    stats.generation_seconds = 2.0
    assert stats.target_passes == 4
    assert stats.generated_tokens == 9
    assert stats.acceptance_rate == pytest.approx(5 / 10)
    assert stats.tokens_per_target_pass == pytest.approx(9 / 4)
    assert stats.mean_accepted_length == pytest.approx(5 / 3)
    assert stats.per_position_drafted == [3, 3, 2, 2]
    assert stats.per_position_accepted == [2, 1, 1, 1]
    assert stats.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 0.5, 0.5])
    assert stats.accepted_length_histogram == [1, 1, 0, 0, 1]
    assert stats.generation_throughput == pytest.approx(4.5)
    assert stats.passes_by_verified == [1, 0, 1, 0, 2]  # (one plain step, a 2-token pass, two 4-token ones)


def test_passes_by_verified_counts_each_pass_once_by_its_length():
    """Item j counts the passes that verified j drafted tokens; declined rounds are plain steps (item 0), and
    the items add up to every target pass."""
    stats = SpecStats()
    assert stats.passes_by_verified == [0]
    for drafted, accepted, declined in [(1, 1, False), (0, 0, True), (3, 0, False), (1, 0, False), (0, 0, False)]:
        stats.record_round(drafted, accepted, accepted + 1, declined=declined)
    assert stats.passes_by_verified == [2, 2, 0, 1]
    assert sum(stats.passes_by_verified) == stats.target_passes
    assert stats.as_dict()["passes_by_verified"] == [2, 2, 0, 1]


def test_declined_rounds_are_plain_steps_counted_apart():
    """A declined round is a target pass that emitted one token and verified nothing: it counts in
    ``declined`` and changes no acceptance figure."""
    stats = SpecStats()
    stats.record_round(drafted=3, accepted=3, generated=4)
    stats.record_round(drafted=0, accepted=0, generated=1, declined=True)
    stats.record_round(drafted=0, accepted=0, generated=1)
    assert stats.declined == 1
    assert stats.target_passes == 3
    assert stats.acceptance_rate == 1.0 and stats.accepted_length_histogram == [0, 0, 0, 1]
    assert stats.as_dict()["declined"] == 1 and stats.copy().declined == 1


def test_empty_stats_do_not_divide_by_zero():
    stats = SpecStats()
    assert stats.acceptance_rate == stats.tokens_per_target_pass == stats.generation_throughput == 0.0


def test_as_dict_has_glossary_names_and_copy_is_independent():
    stats = SpecStats()
    stats.record_round(3, 2, 3)
    d = stats.as_dict()
    for key in ("acceptance_rate", "tokens_per_target_pass", "generation_throughput",
                "accepted_length_histogram", "per_position_acceptance", "draft_seconds", "verify_seconds"):
        assert key in d
    snap = stats.copy()
    stats.record_round(3, 0, 1)
    assert snap.per_position_drafted == [1, 1, 1]
    assert snap.target_passes == 1


def test_plain_step_is_the_mean_time_of_the_passes_that_verified_no_drafted_token():
    """docs/metrics.md: plain_step = plain_step_seconds / passes_by_verified[0] (declined proposals are plain
    steps); None without any. Fails for a mean over every pass, or one that counts declined rounds apart."""
    stats = SpecStats()
    assert stats.plain_step is None
    stats.record_round(drafted=3, accepted=3, generated=4)
    stats.record_round(drafted=0, accepted=0, generated=1, declined=True)
    stats.record_round(drafted=0, accepted=0, generated=1)
    stats.verify_seconds, stats.plain_step_seconds = 5.0, 3.0
    assert stats.plain_step == pytest.approx(1.5)
    assert stats.as_dict()["plain_step"] == pytest.approx(1.5)


def test_the_decoder_times_its_plain_steps_apart_from_its_verify_passes():
    """SpeculativeDecoder adds a round's target pass to plain_step_seconds only where it verified no drafted
    token: on a fake clock whose passes cost 1 + 0.5 n seconds, a fixed k = 3 prompt lookup's plain steps
    average exactly 1.5 s whatever its verify passes cost. Fails if verify passes were counted in (the
    mean would exceed 1.5) or plain steps missed (None, or the sum short of 1.5 per plain step)."""
    from sampling_harness import CostedEngine, FakeClock
    from specdec_gguf import SpeculativeDecoder
    from specdec_gguf.drafters import PromptLookupDrafter
    from specdec_gguf.engines import InMemoryEngine
    from specdec_gguf.schedule import FixedSchedule

    clock = FakeClock()
    target = CostedEngine(InMemoryEngine.random(64, seed=3, sharpness=4.0), clock, per_pass=1.0, per_token=0.5)
    decoder = SpeculativeDecoder(target, PromptLookupDrafter(), num_draft_tokens=3, schedule=FixedSchedule(3),
                                 clock=clock)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    stats = decoder.generate(prompt, 48, ignore_eog=True).stats
    plain, verifying = stats.passes_by_verified[0], sum(stats.passes_by_verified[1:])
    assert plain > 0 and verifying > 0  # (both kinds of round happened)
    assert stats.plain_step == pytest.approx(1.5)
    assert stats.plain_step_seconds == pytest.approx(1.5 * plain)
    assert stats.verify_seconds > stats.plain_step_seconds
