"""What a pass costs beyond its size: llama.cpp's graph switch, and a draft model's start.

llama.cpp reuses its compute graph when a pass has the size of the one before and rebuilds
it otherwise, so a plain step right after a verify pass costs more than one after a plain
step (on Gemma 3 270M ~7% of a pass, on the tiny test models over half). A proposal from a
draft model costs a longer first pass (it takes in what was committed since) and then one
pass per token. These tests pin how the profile, the schedule, the guard and the simulator
account for both.
"""

from __future__ import annotations

import json

import pytest

from specdec_gguf import DraftProposal, SpeculativeDecoder
from specdec_gguf.costfit import DraftPrice
from specdec_gguf.drafters import AutoregressiveDrafter
from specdec_gguf.engines.simulated import SimulatedDraftEngine, TraceEngine, VirtualClock
from specdec_gguf.guard import GainGuard
from specdec_gguf.profile import FORMAT, CostProfile, load_cached, measure, save
from specdec_gguf.proposal import NO_PROPOSAL
from specdec_gguf.schedule import AdaptiveSchedule, ScheduleConstants
from specdec_gguf.simulation import curve_profile, simulate_run, synthetic_traces

MS = 1e-3


def _schedule(switch: float, **kwargs) -> AdaptiveSchedule:
    costs = CostProfile({1: 1 * MS, 2: 1.5 * MS, 3: 2.0 * MS}, switch_seconds=switch)
    return AdaptiveSchedule(4, target_costs=costs, free_drafter=True, priors={True: [0.6], False: [0.6]}, **kwargs)


def test_an_unsure_verify_after_plain_steps_pays_for_the_switch_it_causes():
    """A 60%-sure token is worth verifying at these costs (1.6 expected tokens for 1.5 plain steps), but
    not if the plain step after it pays a rebuilt graph (half a step, when the token is rejected).
    Inside a run of verify passes the next plain step pays the switch anyway: verified again.
    Fails if the schedule ignored the switch, or charged it inside a run too."""
    proposal = DraftProposal(tokens=(1, 2), buckets=(0, 0))
    unaware, aware = _schedule(0.0), _schedule(0.5 * MS)
    for schedule in (unaware, aware):
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 1 * MS)  # a plain step, at the profile's cost
    assert unaware.choose(proposal, True) == 1
    assert aware.choose(proposal, True) == 0
    aware.observe(proposal, 1, 1, 2, True, 0.0, 1.5 * MS)  # a verify pass (the last pass had 2 tokens)
    assert aware.choose(proposal, True) == 1


def test_the_switch_is_learned_from_plain_steps_after_verify_passes():
    """The profile knew no switch; plain steps after verify passes cost 0.6 ms more than after plain
    steps: the fit finds it (and leaves T(1) at the plain-after-plain cost)."""
    schedule = _schedule(0.0)
    proposal = DraftProposal(tokens=(1,), buckets=(0,))
    for _ in range(6):
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 1 * MS)
        schedule.observe(proposal, 1, 1, 2, True, 0.0, 1.5 * MS)
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 1.6 * MS)
    schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 1 * MS)  # a refresh is due by now
    assert schedule.switch_cost() == pytest.approx(0.6 * MS, rel=0.05)
    assert schedule.verify_cost(1) == pytest.approx(1 * MS, rel=0.05)


def _guard(quiet_rounds: int | None = None, quiet_pause: int | None = None,
           quiet_again: int | None = None, quiet_share: float = 0.0) -> GainGuard:
    return GainGuard(window=24, min_rounds=8, tolerance=0.02, slack=2.0, first_pause=8, max_pause=64,
                     quiet_rounds=quiet_rounds, quiet_pause=quiet_pause, quiet_again=quiet_again,
                     quiet_share=quiet_share)


@pytest.mark.parametrize("after", [1.0, 1.8])
def test_the_guard_charges_a_verify_pass_with_the_dearer_plain_step_after_it(after):
    """Each verify pass gains a little over plain steps (2 tokens in 1.9 steps), but the plain step after
    it costs 1.8 steps: drafting loses, and the guard pauses it. Negative control (after = 1.0): the plain
    step after costs what any does, and drafting goes on. Fails if the guard scored passes alone."""
    guard = _guard()
    for _ in range(4):
        guard.record(0, 1, 0.0, 1 * MS, after_verify=False)  # plain steps: what one costs
    for _ in range(12):
        guard.asked()
        guard.record(1, 2, 0.0, 1.9 * MS, after_verify=False)
        guard.record(0, 1, 0.0, after * MS, after_verify=True)
    assert guard.paused() == (after > 1.0)


@pytest.mark.parametrize("search, quiet, pauses_at", [(0.01, 8, None), (0.04, 8, 8), (0.04, None, 24)])
def test_searches_that_never_verify_pause_once_they_cost_more_than_the_tolerance(search, quiet, pauses_at):
    """Prompt lookup on open text with a tiny model: every round searches (4% of a plain step here,
    4-8% measured at 140 us passes) and nothing is ever verified. That is no bet's noisy outcome but
    measured time, so 8 such rounds in a row pause a free drafter with no slack (a costly drafter, whose
    looks teach its calibration: a full window). Negative control: searches at 1% (within the 2%
    tolerance) go on. Fails with the slack (0.04 * 24 = 0.96 tokens), or if the quiet rounds were ignored."""
    guard = _guard(quiet)
    guard.record(0, 1, 0.0, 1 * MS, after_verify=False)
    paused_at = None
    for round_ in range(48):
        if guard.paused():
            paused_at = round_
            break
        guard.asked()
        guard.record(0, 1, search * MS, 1 * MS, after_verify=False)
    assert paused_at == pauses_at


def _quiet_searches(guard: GainGuard, rounds: int = 160, verify_at: int | None = None) -> list[tuple[int, int]]:
    """(rounds searched, rounds paused) of each pause while every search costs 4% of a plain step and
    finds nothing (but the one at ``verify_at``, which verifies a token)."""
    guard.record(0, 1, 0.0, 1 * MS, after_verify=False)
    searching, pauses, paused_for = 0, [], 0
    for round_ in range(rounds):
        if guard.paused():
            paused_for += 1
            continue
        if paused_for:
            pauses.append((searching, paused_for))
            searching, paused_for = 0, 0
        guard.asked()
        if round_ == verify_at:
            guard.record(1, 2, 0.04 * MS, 1.2 * MS, after_verify=False)
        else:
            guard.record(0, 1, 0.04 * MS, 1 * MS, after_verify=False)
        searching += 1
    return pauses


@pytest.mark.parametrize("quiet_pause, quiet_again, expected", [(None, None, [(8, 8), (8, 16), (8, 32)]),
                                                                (16, None, [(8, 16), (8, 32), (8, 64)]),
                                                                (16, 2, [(8, 16), (2, 32), (2, 64)])])
def test_after_a_pause_new_quiet_rounds_are_needed_and_the_pauses_double(quiet_pause, quiet_again, expected):
    """Searches that keep losing: 8 rounds, a pause of 8; then 8 new rounds (a copy that began during the
    pause is found in them), a pause of 16; then 32. With a longer first quiet pause (the schedule's for
    prompt lookup: 16), the pauses double from there; with ``quiet_again`` (the schedule's: 2) that many
    new rounds make the next verdict, the drafter having shown it finds nothing here. Fails if the first
    round after a pause re-paused on the old rounds' evidence (a tiny model's repetitive output went
    undrafted for 200 tokens), if the pauses stopped doubling, or if either setting were ignored."""
    assert _quiet_searches(_guard(8, quiet_pause, quiet_again))[:3] == expected


@pytest.mark.parametrize("share, first", [(0.0, 16), (0.002, 38), (0.004, 18)])
def test_a_quiet_pause_lasts_until_the_rounds_after_it_cost_at_most_their_share(share, first):
    """Searches at 4% of a plain step that find nothing: with a share of 0.2% the first quiet pause lasts
    until the 2 quiet rounds after it cost at most that (2 * 0.04 / 0.002 - 2 = 38 rounds), and the pauses
    double from there up to the most (64); at 0.4%, 18 rounds; without a share, the quiet pause (16) as
    before. Fails if the pause ignored what the quiet rounds lost, or outgrew the most a pause may last."""
    pauses = _quiet_searches(_guard(8, 16, 2, quiet_share=share), rounds=240)[:3]
    assert pauses[0][0] == 8 and pauses[0][1] in (first, first + 1)  # (float rounding of the share)
    assert [p[0] for p in pauses[1:]] == [2, 2]
    assert [p[1] for p in pauses[1:]] == [min(2 * pauses[0][1], 64), 64]


def test_a_round_that_verified_makes_the_next_quiet_verdict_wait_for_a_whole_window():
    """After a quiet pause 2 quiet rounds pause again, but once a round verified a token the drafter was
    worth asking: the next verdict needs 8 quiet rounds again (negative control: without the verified
    round, 2), and as drafting paid, the pause starts from the quiet pause again. Fails if the shorter
    count outlived a round that verified."""
    assert _quiet_searches(_guard(8, 16, 2), rounds=80)[:2] == [(8, 16), (2, 32)]
    assert _quiet_searches(_guard(8, 16, 2), rounds=80, verify_at=25)[:2] == [(8, 16), (1 + 1 + 8, 16)]


def test_a_lost_bet_pauses_for_the_first_pause_even_with_a_longer_quiet_pause():
    """The quiet pause is for searches that cost time and found nothing; rounds whose verified bets lost
    (1 token in 1.5 plain steps, 12 times) pause for the first pause, 8, as before. Fails if the quiet
    pause applied to every verdict (a copy with frequent edits then waited 16 rounds: 0.97x -> 0.95x
    plain in the simulation)."""
    guard = _guard(8, quiet_pause=16)
    guard.record(0, 1, 0.0, 1 * MS, after_verify=False)
    for _ in range(12):
        guard.asked()
        guard.record(2, 1, 0.0, 1.5 * MS, after_verify=False)
        if guard.paused():
            break
    assert 1 + guard.claim_pause() == 8


def _losing_bets(guard: GainGuard, rounds: int) -> list[tuple[int, int]]:
    """(rounds bet, rounds paused) of each pause while every round verifies 2 tokens and keeps 1 in 1.5 plain
    steps (half a step lost a round)."""
    guard.record(0, 1, 0.0, 1 * MS, after_verify=False)
    betting, pauses = 0, []
    for _ in range(rounds):
        paused = guard.claim_pause()
        if paused:
            pauses.append((betting, paused))
            betting = 0
        guard.asked()
        guard.record(2, 1, 0.0, 1.5 * MS, after_verify=False)
        betting += 1
    return pauses


@pytest.mark.parametrize("fresh, expected", [(False, [(8, 8), (1, 16), (1, 32)]), (True, [(8, 8), (8, 16), (8, 32)])])
def test_a_pause_on_lost_bets_needs_new_rounds_before_the_next_when_the_window_starts_afresh(fresh, expected):
    """Bets that keep losing: 8 rounds, a pause of 8. With the rounds it paused on kept, the first round after
    it pauses again (16, then 32); with ``fresh_after_pause`` (the schedule's for prompt lookup) the window
    starts afresh and the next verdict rests on 8 new rounds, the pauses still doubling. Fails if the window
    were not emptied, or emptying it reset the doubling."""
    guard = GainGuard(window=24, min_rounds=8, tolerance=0.02, slack=2.0, first_pause=8, max_pause=64,
                      fresh_after_pause=fresh)
    assert _losing_bets(guard, 40)[:3] == expected


def _bets_after_a_pause(guard: GainGuard, first_after: tuple[int, int]) -> list[tuple[int, int]]:
    """(rounds bet, rounds paused) of each pause while every round verifies 2 tokens and keeps 1 in 1.5 plain
    steps (half a step lost), but the first round after the first pause, which keeps ``first_after``
    (verified, generated) in 1.5 steps."""
    guard.record(0, 1, 0.0, 1 * MS, after_verify=False)
    betting, pauses = 0, []
    for _ in range(30):
        paused = guard.claim_pause()
        if paused:
            pauses.append((betting, paused))
            betting = 0
        verified, generated = first_after if len(pauses) == 1 and betting == 0 else (2, 1)
        guard.asked()
        guard.record(verified, generated, 0.0, 1.5 * MS, after_verify=False)
        betting += 1
    return pauses


@pytest.mark.parametrize("resume, first_after, expected", [
    (True, (2, 3), [(8, 8), (2, 16)]),  # it gained 1.5 tokens: drafting goes on; the next loss pauses
    (False, (2, 3), [(8, 8), (1, 16)]),  # the rule before: the window still lost, so it paused again
    (True, (2, 1), [(8, 8), (1, 16)]),  # it lost: paused again at once, for twice as long
])
def test_a_round_that_gains_right_after_a_pause_resumes_drafting(resume, first_after, expected):
    """Bets lose for 8 rounds (half a step each): a pause of 8. The first round after it gains (3 tokens in
    1.5 steps): with ``resume_on_gain`` drafting goes on, and the next losing round, the window still losing,
    pauses for the doubled 16; without, the gaining round itself paused again. Negative control: a first
    round that loses pauses again at once either way. Fails if a gaining round paused, or a losing one didn't."""
    guard = GainGuard(window=24, min_rounds=8, tolerance=0.02, slack=2.0, first_pause=8, max_pause=64,
                      resume_on_gain=resume)
    assert _bets_after_a_pause(guard, first_after)[:2] == expected


@pytest.mark.parametrize("on", [True, False])
def test_the_schedule_hands_resume_on_gain_to_both_drafters_guards(on):
    """ScheduleConstants.guard_resume_on_gain reaches the guard of a draft model and of prompt lookup. Fails if
    either drafter's guard ignored it."""
    from specdec_gguf.schedule import ScheduleConstants

    for free_drafter in (True, False):
        schedule = AdaptiveSchedule(8, free_drafter=free_drafter, priors={True: [0.5], False: [0.5]},
                                    constants=ScheduleConstants(guard_resume_on_gain=on))
        assert schedule.guard.resume_on_gain is on


@pytest.mark.parametrize("free_drafter, on, fresh", [(True, True, True), (False, True, False), (True, False, False)])
def test_only_a_free_drafters_guard_starts_afresh_after_a_pause(free_drafter, on, fresh):
    """ScheduleConstants.guard_fresh_after_pause reaches prompt lookup's guard, not a draft model's (each round
    after a pause pays the draft's catch-up and passes). Fails if either drafter got the other's guard."""
    from specdec_gguf.schedule import ScheduleConstants

    schedule = AdaptiveSchedule(8, free_drafter=free_drafter, priors={True: [0.5], False: [0.5]},
                                constants=ScheduleConstants(guard_fresh_after_pause=on))
    assert schedule.guard.fresh_after_pause is fresh


def test_a_draft_proposal_costs_a_start_and_a_price_per_token():
    """Proposals of 1..8 tokens each cost twice the draft profile's F + k·d: both parts scale, so the price
    of one more drafted token stays d (not the average price of a short proposal, which includes F)."""
    target = CostProfile({1: 4 * MS, 2: 6 * MS, 3: 7 * MS, 5: 8 * MS, 9: 10 * MS})
    draft = CostProfile({1: 0.1 * MS, 2: 0.3 * MS}, switch_seconds=0.05 * MS)  # F = 0.3 + 0.05 - 0.1
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.9], False: [0.9]})
    assert (schedule.draft_price.start, schedule.draft_price.per_token) == pytest.approx((0.25 * MS, 0.1 * MS))
    for k in range(1, 9):
        proposal = DraftProposal(tokens=(1,) * k, buckets=(0,) * k)
        schedule.observe(proposal, 0, 0, 1, True, 2 * (0.25 + 0.1 * k) * MS, 4 * MS)
    assert (schedule.draft_price.start, schedule.draft_price.per_token) == pytest.approx((0.5 * MS, 0.2 * MS))


def test_a_proposals_overhead_is_fitted_apart_from_its_price_per_token():
    """Proposals of 1..8 tokens each cost the draft profile's F + k·d plus 1 ms (a drafter's own work per
    proposal and its first pass on caches the target's pass evicted: alike for every length): the price fits
    the two apart, so a further token costs d and a proposal's start F + 1 ms; the overhead is passed on in
    the profile's one-token passes (once) and the scale at 1. Proposals alike in length can't tell the two
    apart: their overhead is the one remembered (none: their average ratio prices each token), nor can proposals
    whose lengths differ too little (noise would tilt the line). Fails with one
    scale for both (a further token priced at 2.3x d), with an overhead fitted from alike proposals, from a
    generation's cold first ones, or left out of a catch-up's price."""
    target = CostProfile({1: 4 * MS, 2: 6 * MS, 3: 7 * MS, 5: 8 * MS, 9: 10 * MS})
    draft = CostProfile({1: 0.1 * MS, 2: 0.3 * MS}, switch_seconds=0.05 * MS)  # F = 0.25, d = 0.1

    def priced(lengths, constants=None, cold=5 * MS, noise=lambda k: 0.0):
        schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.9], False: [0.9]},
                                    constants=constants)
        schedule.start(10)
        for k in [1] * schedule.c.cold_proposals + lengths:  # (the first ones cold: their caches from the prefills)
            warm = (0.25 + 0.1 * k + 1.0 + noise(k)) * MS
            seconds = cold if schedule._proposals < schedule.c.cold_proposals else warm
            schedule.observe(DraftProposal(tokens=(1,) * k, buckets=(0,) * k), 0, 0, 1, True, seconds, 4 * MS)
        return schedule.draft_price

    price = priced(list(range(1, 9)) * 2)
    assert (price.start, price.per_token, price.overhead) == pytest.approx((1.25 * MS, 0.1 * MS, 1.0 * MS))
    assert price.catch_up(1) == pytest.approx(0.3 * MS + 1.0 * MS)  # (one token to take in, then the anchor)
    assert price.take_overhead() == pytest.approx(10.0)  # 1 ms in the profile's 0.1 ms passes
    assert price.take_overhead() is None
    assert price.take_scale() == pytest.approx(1.0)
    assert priced(list(range(1, 9)) * 2, cold=0.35 * MS).overhead == pytest.approx(1.0 * MS)  # cold ones left out
    one_scale = priced(list(range(1, 9)) * 2, ScheduleConstants(draft_overhead=False))
    assert one_scale.overhead == 0.0 and one_scale.per_token > 2 * 0.1 * MS
    alike = priced([8] * 16)
    assert alike.overhead == 0.0 and alike.take_overhead() is None
    # 7- and 8-token proposals, the 7s 0.05 ms slow: a line through them would say 1.5 ms and half the price.
    assert priced([7, 8] * 8, noise=lambda k: 0.05 * (k == 7)).take_overhead() is None
    assert alike.per_token == pytest.approx((0.25 + 0.8 + 1.0) / (0.25 + 0.8) * 0.1 * MS)
    remembered = DraftPrice(draft, window=8, max_catch_up=None, overhead=True, remembered_overhead=10.0)
    assert (remembered.start, remembered.per_token) == pytest.approx((1.25 * MS, 0.1 * MS))
    for _ in range(8):
        remembered.record(8, (0.25 + 0.8 + 1.0) * MS)  # alike, as remembered: the price stands
    assert (remembered.start, remembered.per_token) == pytest.approx((1.25 * MS, 0.1 * MS))
    assert remembered.take_overhead() is None  # (nothing of this run's own to pass on)
    assert DraftPrice(draft, window=8, max_catch_up=None, remembered_overhead=10.0).overhead == 0.0  # (off)


def test_a_generations_first_proposals_may_lower_the_draft_price_but_not_raise_it():
    """The first proposals of each generation run with cold caches (3x their price here): they can't
    raise the price, so they can't price drafting out of the run; later ones as slow do. A first one
    faster than the profile says still lowers it. Fails with one cold proposal (the second raised it)."""
    target = CostProfile({1: 4 * MS, 2: 6 * MS, 3: 7 * MS, 5: 8 * MS, 9: 10 * MS})
    draft = CostProfile({1: 0.1 * MS, 2: 0.3 * MS}, switch_seconds=0.05 * MS)  # F = 0.25, d = 0.1
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.9], False: [0.9]})
    one = DraftProposal(tokens=(1,), buckets=(0,))  # priced F + d = 0.35 ms by the profile
    schedule.start(10)
    for _ in range(schedule.c.cold_proposals):
        schedule.observe(one, 1, 1, 2, True, 3 * 0.35 * MS, 4 * MS)
        assert schedule.draft_price.per_token == pytest.approx(0.1 * MS)
    for _ in range(schedule.c.cold_proposals + 1):  # later proposals as slow count
        schedule.observe(one, 1, 1, 2, True, 3 * 0.35 * MS, 4 * MS)
    assert schedule.draft_price.per_token == pytest.approx(0.3 * MS)
    schedule.start(10)  # a new generation: cold again, the price as learned
    schedule.observe(one, 1, 1, 2, True, 9 * 0.35 * MS, 4 * MS)
    assert schedule.draft_price.per_token == pytest.approx(0.3 * MS)
    fresh = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.9], False: [0.9]})
    fresh.start(10)
    fresh.observe(one, 1, 1, 2, True, 0.5 * 0.35 * MS, 4 * MS)
    assert fresh.draft_price.per_token == pytest.approx(0.05 * MS)


def test_a_draft_price_remembered_from_earlier_runs_prices_a_fresh_run_until_its_own_proposals_say_otherwise():
    """Earlier runs measured the draft's proposals at 2x its profile (as a tiny F32 draft runs between target
    passes at 1 thread): a fresh schedule prices a token at 2x from the start, a cold first proposal at 3x is
    clipped to that, and this run's own proposals (at the profile's price) take over once they outnumber the
    remembered readings. ``take_scale`` passes on the median of the run's own readings after its cold ones where
    there are two, else of them all, unclipped, and never below 1. Fails if the remembered scale were ignored (0.1
    ms), taken as a single reading (the first proposal replaced it), or passed on clipped, from the wrong
    readings or below the profile's price."""
    draft = CostProfile({1: 0.1 * MS, 2: 0.3 * MS}, switch_seconds=0.05 * MS)  # F = 0.25, d = 0.1
    price = DraftPrice(draft, window=8, max_catch_up=None, remembered=2.0)
    assert price.per_token == pytest.approx(0.2 * MS)
    assert price.take_scale() is None  # nothing of its own yet
    price.record(1, 3 * 0.35 * MS, cold=True, context=0, untaken=0)  # 3x the price a one-token proposal is shaped
    assert price.per_token == pytest.approx(0.2 * MS)
    assert price.take_scale() is None  # one reading: too few to pass on (and now taken)
    for _ in range(4):
        price.record(1, 0.35 * MS, context=0, untaken=0)
    assert price.per_token == pytest.approx(0.1 * MS)  # [2, 2, 2 (clipped), 1, 1, 1, 1]: its own readings rule
    for _ in range(5):
        price.record(1, 3 * 0.35 * MS, cold=True, context=0, untaken=0)
    assert price.take_scale() == pytest.approx(1.0)  # the four warm ones' median (all nine: 3)
    assert price.take_scale() is None
    for cold in (True, True, False):  # a pair that drafts a few times an answer: mostly cold proposals
        price.record(1, (3 if cold else 1) * 0.35 * MS, cold=cold, context=0, untaken=0)
    assert price.take_scale() == pytest.approx(3.0)  # one warm reading is too few: the median of all
    for _ in range(2):  # proposals cheaper than shaped (a catch-up shaped from all-logit passes)
        price.record(1, 0.4 * 0.35 * MS, context=0, untaken=0)
    assert price.take_scale() == 1.0  # never passed on below the profile's price
    assert DraftPrice(draft, window=8, max_catch_up=None).per_token == pytest.approx(0.1 * MS)
    assert DraftPrice(None, window=8, max_catch_up=None, remembered=2.0).per_token is None  # (no profile to scale)


def test_a_catch_up_is_priced_as_a_pass_that_asks_for_the_last_logits_only():
    """A draft's catch-up (the tokens committed since its last proposal, then the anchor) asks for the last
    position's logits, where the profile's verify passes compute every position's: on a large vocabulary those
    cost severalfold more per token (Gemma 3 270M, 2 threads: T(1) 23 ms, T(9) 71 ms, a 16-token prefill without
    logits 28 ms; a 129-token catch-up 214 ms, priced 669 from the verify curve). Priced from T(2) and the
    prefill's cost per token it is 247 ms; never above the verify curve, and as before without a prefill timing
    or with the constant off. Fails if catch-ups were priced from the verify curve."""
    gemma = CostProfile({1: 23 * MS, 2: 29.7 * MS, 3: 35 * MS, 5: 50 * MS, 9: 71 * MS}, prefill_seconds=27.7 * MS)
    assert gemma.catch_up_cost(129) == pytest.approx(29.7 * MS + 127 * 27.7 * MS / 16)
    assert gemma.catch_up_cost(129) < 0.4 * gemma.cost(129)
    assert gemma.catch_up_cost(2) == gemma.cost(2) and gemma.catch_up_cost(1) == gemma.cost(1)
    flat = CostProfile({1: 1 * MS, 2: 1.1 * MS, 9: 1.5 * MS}, prefill_seconds=16 * MS)  # (a pass's logits cost little)
    assert flat.catch_up_cost(9) == flat.cost(9)  # never above the verify curve
    untimed = CostProfile(dict(gemma.seconds))
    assert untimed.catch_up_cost(129) == untimed.cost(129)
    assert CostProfile.from_dict(gemma.as_dict()).prefill_seconds == gemma.prefill_seconds
    price = DraftPrice(gemma, window=8, max_catch_up=None)
    assert price.catch_up(128, 128 + 16) == pytest.approx(gemma.catch_up_cost(129))
    assert DraftPrice(gemma, window=8, max_catch_up=None, last_logits=False).catch_up(128, 128 + 16) == \
        pytest.approx(gemma.cost(129))
    schedule = AdaptiveSchedule(8, target_costs=gemma, draft_costs=gemma, priors={True: [0.5], False: [0.5]})
    assert schedule.draft_price.catch_up(128, 144) == pytest.approx(gemma.catch_up_cost(129))
    off = AdaptiveSchedule(8, target_costs=gemma, draft_costs=gemma, priors={True: [0.5], False: [0.5]},
                           constants=ScheduleConstants(catch_up_from_prefill=False))
    assert off.draft_price.catch_up(128, 144) == pytest.approx(gemma.cost(129))


def test_a_draft_proposal_is_priced_at_its_context_and_with_its_catch_up():
    """A small Q8_0 draft's profile (passes after 16 and after 128 tokens): after a 380-token prompt each
    pass attends to the context, and a look after 20 plain rounds first takes those tokens in. Proposals
    that cost just what the profile says at their context, catch-up included, leave the price's scale at
    1: the price of a token is the one-token pass at the context, and a look's price counts the context
    once. Fails if proposals were shaped without the context or the catch-up (the scale then learned
    1.3x-1.6x, and the next look's price, which adds the context itself, counted it twice)."""
    target = CostProfile({1: 4 * MS, 2: 4.2 * MS, 3: 4.4 * MS, 5: 4.8 * MS, 9: 5.6 * MS})
    draft = CostProfile({1: 0.137 * MS, 2: 0.240 * MS, 3: 0.289 * MS, 5: 0.411 * MS, 9: 0.478 * MS},
                        switch_seconds=0.053 * MS, long_context=128, long_seconds={1: 0.179 * MS, 9: 0.857 * MS})
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.5], False: [0.5]})

    def at(n: int, before: int) -> float:  # the profile's pass over n tokens after ``before`` of context
        return draft.cost(n) + draft.context_slope(n) * (before - 16)

    context = 380
    schedule.start(context)
    for _ in range(schedule.c.cold_proposals + 3):
        four = DraftProposal(tokens=(1,) * 4, buckets=(0,) * 4)
        schedule.observe(four, 4, 2, 3, True, at(2, context - 1) + draft.switch_seconds + 3 * at(1, context), 5 * MS)
        context += 3
    for _ in range(20):
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 4 * MS)
    context += 20
    look = DraftProposal(tokens=(1,), buckets=(0,))
    schedule.observe(look, 1, 0, 1, True, at(21, context - 20) + draft.switch_seconds, 5 * MS)
    context += 1
    price = schedule.draft_price
    assert price.per_token == pytest.approx(at(1, context - 1), rel=0.01)  # (a token of context either way)
    assert price.catch_up(40, context + 40) == pytest.approx(at(41, context), rel=0.01)
    assert at(1, context) > 1.3 * draft.cost(1)  # (the context matters here)


@pytest.mark.parametrize("room", [4, 12, 1000])
def test_a_look_whose_catch_up_is_cheap_is_taken_even_near_the_end(room):
    """A draft that doesn't pay is looked at now and then; a look must earn its price back over the
    tokens left (``_earns_back``, shared with the start of drafting: the refusal is tested there). After
    a short prompt and 8 plain rounds that price is 0.05 of a plain step, so a look with 4 tokens left
    is worth it too. Fails with a fixed room (looks only with more than 16 tokens left, as before)."""
    target = CostProfile({1: 10 * MS, 2: 10.2 * MS, 3: 10.4 * MS, 5: 10.8 * MS, 9: 11.6 * MS})
    draft = CostProfile({1: 0.137 * MS, 2: 0.240 * MS, 3: 0.289 * MS, 5: 0.411 * MS, 9: 0.478 * MS},
                        switch_seconds=0.053 * MS, long_context=128, long_seconds={1: 0.179 * MS, 9: 0.857 * MS})
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.1], False: [0.1]})
    schedule.start(16)
    for _ in range(schedule.c.probe_interval):
        assert schedule.next_k(1000) == 0
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 10 * MS)
    assert schedule.next_k(room) == 8


def test_a_draft_catching_up_is_priced_at_the_context_it_attends_to():
    """A small Q8_0 draft's profile (passes after 16 and after 128 tokens of context): a 58-token
    catch-up after 380 tokens is priced at the curve plus the context's share of it, extrapolated past
    the longest context measured (measured 8.8 ms, priced 9.2; 2.2 ms after 16). Past the drafter's
    catch-up cap it restarts on the latest tokens, from an empty cache. Fails if the context were
    ignored (1.3 ms) or capped at the profile's 128 tokens (3.7 ms)."""
    draft = CostProfile({1: 0.137 * MS, 2: 0.240 * MS, 3: 0.289 * MS, 5: 0.411 * MS, 9: 0.478 * MS},
                        switch_seconds=0.053 * MS, long_context=128, long_seconds={1: 0.179 * MS, 9: 0.857 * MS})
    price = DraftPrice(draft, window=8, max_catch_up=None)
    assert price.catch_up(57, 57 + 16) == pytest.approx(draft.cost(58))  # no context beyond the profile's own
    assert price.catch_up(57, 57 + 380) == pytest.approx(9.2 * MS, rel=0.05)
    capped = DraftPrice(draft, window=8, max_catch_up=32)
    assert capped.catch_up(57, 57 + 380) == pytest.approx(draft.cost(33))


@pytest.mark.parametrize("plain_steps, room, drafts", [(57, 6, False), (57, 200, True), (0, 6, True)])
def test_drafting_that_pays_starts_only_if_the_room_left_earns_back_the_draft_catching_up(plain_steps, room, drafts):
    """Drafting pays (sure tokens, a cheap draft), but the draft last saw the context ``plain_steps``
    tokens ago (a pause, or a stretch before the costs said drafting pays): its first pass must take
    them in, here 0.3 + 57 * 0.15 ms, 9 plain steps, which 6 rounds can't earn back and 200 can.
    Negative controls: with room, or with nothing to catch up on (right after the prompt), it drafts.
    Fails if the catch-up were not priced (a tiny Q8_0 pair's 64-token answers: 0.86x plain)."""
    target = CostProfile({1: 1 * MS, 2: 1.1 * MS, 3: 1.2 * MS, 5: 1.4 * MS, 9: 1.8 * MS})
    draft = CostProfile({1: 0.3 * MS, 2: 0.45 * MS})
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.9], False: [0.9]})
    schedule.start(20)
    assert schedule.next_k(1000) == 8  # drafting pays
    for _ in range(plain_steps):  # rounds the decoder ran as plain steps (and then told the schedule)
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 1 * MS)
    assert (schedule.next_k(room) == 8) == drafts


@pytest.mark.parametrize("catch_up, first_look", [(128, 207), (32, 63), (None, None)])
def test_a_draft_whose_look_costs_too_much_is_not_probed(catch_up, first_look):
    """The same, with a draft a third as costly as the target: catching up on the tokens since the last
    look costs more than 2% of their time until the drafter's catch-up cap (128 tokens by default, ~41
    ms: 207 rounds of 10 ms; 32 tokens, ~13 ms: 63 rounds; no cap: never), so it is not probed before
    (a probe of such a draft cost 3% of a 64-token answer on the tiny Q8_0 pair). Fails without the
    price check, or with the default cap assumed for every drafter."""
    target = CostProfile({1: 10 * MS, 2: 10.2 * MS, 3: 10.4 * MS, 5: 10.8 * MS, 9: 11.6 * MS})
    draft = CostProfile({1: 3 * MS, 2: 3.3 * MS})
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.1], False: [0.1]},
                                draft_catch_up=catch_up)
    assert schedule._potential_value() > schedule.c.margin  # drafting could pay if every token were right
    looks = []
    for _ in range(300):
        looks.append(schedule.next_k(1000))
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 10 * MS)
    assert (looks.index(8) if 8 in looks else None) == first_look


def test_a_warm_decoders_next_generation_looks_at_a_draft_that_took_its_prompt_in():
    """On a warm decoder (a server, a batch) the draft takes the next prompt in with its start: a look
    then costs one drafted token, not a catch-up on every round since the last look. The draft a third
    as costly as the target, with no catch-up cap, is never looked at during a long generation (as
    above); the next generation looks at once. Fails if a look were priced by the rounds since the last
    one (then never: 300 tokens to catch up on, ~93 ms against 2% of 300 rounds, 60 ms)."""
    target = CostProfile({1: 10 * MS, 2: 10.2 * MS, 3: 10.4 * MS, 5: 10.8 * MS, 9: 11.6 * MS})
    draft = CostProfile({1: 3 * MS, 2: 3.3 * MS})
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.1], False: [0.1]},
                                draft_catch_up=None)
    schedule.start(16)
    for _ in range(300):
        assert schedule.next_k(1000) == 0
        schedule.observe(NO_PROPOSAL, 0, 0, 1, True, 0.0, 10 * MS)
    schedule.start(16 + 300 + 20)  # the next prompt, which the draft's start took in
    assert schedule.next_k(1000) == 8

def test_the_decoder_prices_looks_with_the_drafters_own_catch_up_cap():
    from specdec_gguf import SpeculativeDecoder
    from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
    from specdec_gguf.engines.memory import InMemoryEngine

    target = InMemoryEngine.random(64, seed=1, n_ctx=256)
    for cap in (16, None):
        decoder = SpeculativeDecoder(target, AutoregressiveDrafter(target.perturbed(0.1, seed=2),
                                                                   max_catch_up=cap), profile_cache=False)
        assert decoder.schedule.draft_price.max_catch_up == cap
    assert SpeculativeDecoder(target, PromptLookupDrafter(), profile_cache=False).schedule.draft_price.max_catch_up \
        is None  # a free drafter has nothing to catch up on


@pytest.mark.parametrize("greedy, right, again", [(True, True, True), (True, False, False),
                                                  (False, 0.95, True), (False, 0.6, False), (False, 0.0, False)])
def test_a_look_whose_first_token_was_right_looks_again_next_round(greedy, right, again):
    """A draft whose own probabilities undersell it (random or distilled weights: right 85-90% of the
    time at top probabilities of 0.05-0.5) is only looked at, and one look a long interval is too little
    evidence to ever trust it. A look whose first token was right looks again the next round; a wrong
    one waits twice the interval, as before. Sampled, "right" is a chance of acceptance at which
    drafted runs could pay (here 0.73: 0.6 is not; looks at such chances repeated round after round
    where drafting can't pay). Fails if a sampled look's chance counted as right at any value."""
    target = CostProfile({1: 10 * MS, 2: 17 * MS, 3: 23 * MS, 5: 35 * MS, 9: 58 * MS})
    draft = CostProfile({1: 0.3 * MS, 2: 0.33 * MS})
    schedule = AdaptiveSchedule(8, target_costs=target, draft_costs=draft, priors={True: [0.1], False: [0.1]})
    assert 0.6 < schedule.min_confidence() < 0.95
    interval = schedule.c.probe_interval
    for _ in range(interval):
        assert schedule.next_k(1000) == 0
        schedule.observe(NO_PROPOSAL, 0, 0, 1, greedy, 0.0, 10 * MS)
    assert schedule.next_k(1000) == 8  # a look
    look = DraftProposal(tokens=(5,), buckets=(0,))
    schedule.observe(look, 0, 0, 1, greedy, 0.3 * MS, 10 * MS, first_matched=right)
    waits = 0
    while schedule.next_k(1000) == 0:
        schedule.observe(NO_PROPOSAL, 0, 0, 1, greedy, 0.0, 10 * MS)
        waits += 1
    assert waits == (0 if again else 2 * interval)


def test_the_simulated_target_charges_the_switch():
    clock = VirtualClock()
    costs = CostProfile({1: 1.0, 3: 2.0}, switch_seconds=0.5)
    engine = TraceEngine(list(range(20)), 32, costs, clock)

    def timed(tokens):
        start = clock()
        engine.forward_argmax(tokens)
        return clock() - start

    assert timed([1, 2, 3]) == pytest.approx(2.0)
    assert timed([4]) == pytest.approx(1.5)  # after a 3-token pass: graph rebuilt
    assert timed([5]) == pytest.approx(1.0)  # after a one-token pass: reused


@pytest.mark.parametrize("last", ["forward_last_argmax", "forward_last_logits"])
def test_the_simulated_engines_catch_up_and_draft_in_one_pass(last):
    """A draft's catch-up on [anchor, bonus] is one llama.cpp pass of 2 tokens, not an advance and then a
    forward (which charged a simulated draft a second pass's fixed cost every proposal)."""
    clock = VirtualClock()
    costs = CostProfile({1: 1.0, 2: 1.25}, switch_seconds=0.0)
    engine = SimulatedDraftEngine(list(range(20)), [True] * 20, [0.9] * 20, 32, costs, clock)
    start = clock()
    out = getattr(engine, last)([0, 1])
    assert clock() - start == pytest.approx(1.25)
    assert engine.passes == 1 and engine.n_past == 2
    assert (int(out) if last == "forward_last_argmax" else int(out.argmax())) == 2  # the trace's next token


def test_a_simulated_drafts_overhead_is_charged_once_a_proposal():
    """A simulated draft pays its ``overhead`` on a pass after the clock moved for another engine (a proposal's
    first pass, after the target's), not on its passes back to back; a run pays it every proposal (fixed k = 4
    here: one per round), and ``simulate_run(draft_overhead=)`` sets it. Fails if it were charged every pass or
    never."""
    clock = VirtualClock()
    engine = SimulatedDraftEngine(list(range(20)), [True] * 20, [0.9] * 20, 32, CostProfile({1: 1.0, 2: 1.25}), clock,
                                  overhead=0.5)
    engine.forward_last_logits([0])
    assert clock() == pytest.approx(1.0)  # (nothing ran since it was made: no overhead)
    for _ in range(2):
        clock.advance(4.0)  # (the target's verify pass)
        start = clock()
        engine.forward_last_logits([1])  # the proposal's first pass: + 0.5
        engine.forward_last_logits([2])
        engine.forward_last_logits([3])
        assert clock() - start == pytest.approx(3.5)
    trace = next(t for t in synthetic_traces() if t.id.startswith("copy-edit"))
    costs, full = curve_profile("big-q8"), trace.prompt + trace.output
    draft_costs = CostProfile({1: 0.1 * costs.cost(1), 2: 0.12 * costs.cost(1)})

    def run(overhead: float):
        clock = VirtualClock()
        draft = SimulatedDraftEngine(full, [True] * len(full), [0.9] * len(full), trace.n_vocab, draft_costs, clock,
                                     overhead=overhead)
        decoder = SpeculativeDecoder(trace.target(costs, clock), AutoregressiveDrafter(draft), num_draft_tokens=4,
                                     adaptive=False, clock=clock)
        return decoder.generate(trace.prompt, 64, ignore_eog=True).stats

    free, charged = run(0.0), run(1e-3)
    proposals = charged.per_position_drafted[0]
    assert 8 <= proposals < 64
    # (All but the first, which follows the draft's own prefill: charged there, before the generation's clock.)
    assert charged.generation_seconds - free.generation_seconds == pytest.approx((proposals - 1) * 1e-3)
    assert simulate_run(trace, "big-q8", 64, 4, drafter="draft-model", draft_overhead=0.1).seconds > \
        simulate_run(trace, "big-q8", 64, 4, drafter="draft-model").seconds


def test_measuring_times_plain_steps_after_plain_steps(target):
    """The profile's one-token cost is a pass after another one-token pass, the switch what one pays
    after a pass of another size (never negative: a reused graph is never dearer)."""
    profile = measure(target)
    assert profile.switch_seconds >= 0.0
    assert set(profile.seconds) == {1, 2, 3, 5, 9}


def test_profiles_of_the_older_format_are_measured_again(tmp_path, monkeypatch):
    """Format 1 timed every one-token pass after another size: its T(1) includes the switch; format 2 had
    no long-context timings (a tiny model's first bet then lost: the profile said 9 tokens cost 3.3
    one-token passes where they cost 4.6); format 3 no context prefill (a draft's catch-up priced from the
    verify curve: 3.1x its cost on Gemma 3 270M)."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    save(CostProfile({1: 0.01, 2: 0.015}, key="m"))
    assert load_cached("m") is not None
    path = next(tmp_path.rglob("*.json"))
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT == 4
    for older in (1, 2, 3):
        path.write_text(json.dumps({**data, "format": older}))
        assert load_cached("m") is None


@pytest.mark.parametrize("bound", [True, False])
def test_a_size_the_run_never_verified_costs_at_most_the_passes_that_split_it(bound):
    """VerifyCosts(bound_by_passes=): a profile timed in a busy moment priced 9-token passes at 4.5 ms where this
    run's 3-token passes take 1.4 ms: a 9-token pass costs at most three of them (4.2). The 5-token passes the run
    timed (3.0 ms, as the profile says) keep their own fit, not two 3-token passes' 2.8, and a 6-token pass costs no
    less than they do (3.0, where the profile's line between 5 and 9 says 3.375). Negative control (off): the
    profile's prices stand. Fails if the bound were not applied, or applied to a size the window timed."""
    from specdec_gguf.costfit import VerifyCosts

    profile = CostProfile({1: 1e-3, 2: 1.25e-3, 3: 1.4e-3, 5: 3.0e-3, 9: 4.5e-3})
    costs = VerifyCosts(profile, 9, window=32, refresh_every=1, refresh_seconds=0.0, bound_by_passes=bound)
    for _ in range(4):
        costs.record(1, 1e-3, 1e-3)
    for size, seconds in ((3, 1.4e-3), (5, 3.0e-3), (3, 1.4e-3), (5, 3.0e-3), (3, 1.4e-3)):
        costs.record(size, seconds, seconds)
    table = costs.refit()
    assert (table[2], table[4]) == (pytest.approx(1.4e-3), pytest.approx(3.0e-3))
    assert (table[5], table[8]) == ((pytest.approx(3.0e-3), pytest.approx(4.2e-3)) if bound
                                    else (pytest.approx(3.375e-3), pytest.approx(4.5e-3)))
    assert table == sorted(table)  # (a shorter pass never costs more)


def test_a_copy_under_a_profile_timed_too_dear_is_verified_in_long_passes_again():
    """The demo's first run after installing, simulated: prompt lookup on an answer that copies its input, on
    gemma-epyc's curve, with a profile that priced 5- and 9-token passes at 1.6x what they cost. Without the bound
    the run verified 2 tokens a pass to the end (never timing the dearer sizes); with it, it runs within 10% of a
    run with the right profile. Fails if the online fit kept pricing the untimed sizes as the profile did."""
    from specdec_gguf.drafters import PromptLookupDrafter
    from specdec_gguf.settings import default_num_draft_tokens
    from specdec_gguf.simulation import calibrated_profile

    trace = next(t for t in synthetic_traces() if t.id == "copy-rename")
    right = calibrated_profile("gemma-epyc")
    dear = CostProfile({n: t * (1.6 if n >= 5 else 1.0) for n, t in right.seconds.items()},
                       switch_seconds=right.switch_seconds)
    plain = simulate_run(trace, "gemma-epyc", 160, 0).seconds

    def ratio(profile: CostProfile, bound: bool) -> float:
        schedule = AdaptiveSchedule(default_num_draft_tokens("prompt-lookup", True), target_costs=profile,
                                    free_drafter=True, priors={g: PromptLookupDrafter().acceptance_priors(g)
                                                               for g in (True, False)},
                                    constants=ScheduleConstants(bound_by_passes=bound))
        return plain / simulate_run(trace, "gemma-epyc", 160, None, schedule=schedule).seconds

    stuck, freed, reference = ratio(dear, False), ratio(dear, True), ratio(right, True)
    assert freed > 1.4 * stuck
    assert freed > 0.9 * reference
