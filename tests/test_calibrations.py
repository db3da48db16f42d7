"""Calibrations kept across runs (calibrations.py): a fresh decoder starts from what earlier ones learned."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from specdec_gguf import SpeculativeDecoder, calibrations
from specdec_gguf.confidence import AcceptanceModel
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engines.simulated import TraceEngine, VirtualClock
from specdec_gguf.errors import ConfigError
from specdec_gguf.profile import CostProfile, save
from specdec_gguf.schedule import AdaptiveSchedule, ScheduleConstants
from specdec_gguf.simulation import curve_profile, synthetic_traces

PRIORS = [0.1, 0.3, 0.6, 0.9]


def test_a_model_starts_from_its_priors_and_is_pulled_towards_its_calibration():
    plain = AcceptanceModel(PRIORS)
    warm = AcceptanceModel(PRIORS, calibration=(2.0, 1.0, 0.0, 0.0))
    # A remembered calibration is not bet on before this run's outcomes are in: both start at the priors.
    assert [round(m.confidence(b), 6) for m in (plain, warm) for b in range(4)] == PRIORS * 2
    assert warm.centre == (2.0, 1.0, 0.0, 0.0) and plain.centre == (0.0, 1.0, 0.0, 0.0)
    assert not warm.remembered_unfitted  # (no outcome yet: a refit would have nothing to take in)
    for _ in range(8):  # the same few outcomes, a rejected first token in bucket 1 each time
        plain.update([1], 0)
        warm.update([1], 0)
        if warm.calibration == (0.0, 1.0, 0.0, 0.0):  # (before the first refit: it waits)
            assert warm.remembered_unfitted and not plain.remembered_unfitted
    assert not warm.remembered_unfitted  # (refitted: met)
    # Both fits move down, but each stays nearer its centre: the remembered calibration is the prior.
    assert plain.calibration[0] < 0 and 0 < warm.calibration[0] < 2.0
    assert warm.confidence(2) > plain.confidence(2)


def test_a_remembered_calibration_takes_effect_as_soon_as_the_first_outcomes_favour_it():
    # Bucket 0's prior says 0.1; the remembered calibration about 0.45 there.
    confirmed = AcceptanceModel(PRIORS, calibration=(2.0, 1.0, 0.0, 0.0))
    confirmed.update_calibration(0, True)  # likelihood ratio ~4.5 for the calibration: not yet
    assert round(confirmed.confidence(0), 6) == PRIORS[0]
    confirmed.update_calibration(0, True)  # ~20 by now: the fit takes it
    assert confirmed.confidence(0) > 0.3 and confirmed.calibration[0] > 1.5
    # The same two outcomes move neither a model without one (its first refit waits for four
    # updates) nor one whose first outcomes refute the calibration.
    unremembered = AcceptanceModel(PRIORS)
    refuted = AcceptanceModel(PRIORS, calibration=(2.0, 1.0, 0.0, 0.0))
    for _ in range(2):
        unremembered.update_calibration(0, True)
        refuted.update_calibration(0, False)
    assert [round(m.confidence(b), 6) for m in (unremembered, refuted) for b in range(4)] == PRIORS * 2


def test_the_evidence_a_remembered_calibration_needs_is_a_setting():
    # One right first token in bucket 0 favours the calibration by ~4.5 (0.45 against the prior's 0.1).
    eager = AcceptanceModel(PRIORS, calibration=(2.0, 1.0, 0.0, 0.0), early_evidence=4.0)
    strict = AcceptanceModel(PRIORS, calibration=(2.0, 1.0, 0.0, 0.0), early_evidence=5.0)
    for model in (eager, strict):
        model.update_calibration(0, True)
    assert eager.confidence(0) > 0.3  # 4.5 >= 4: taken
    assert round(strict.confidence(0), 6) == PRIORS[0]  # 4.5 < 5: not yet
    # The schedule hands its constant on.
    schedule = AdaptiveSchedule(8, priors={True: PRIORS, False: PRIORS},
                                calibrations={True: (2.0, 1.0, 0.0, 0.0)},
                                constants=ScheduleConstants(early_evidence=4.0))
    schedule.models[True].update_calibration(0, True)
    assert schedule.models[True].confidence(0) > 0.3
    # Prompt lookup's schedule (a free drafter) hands on the same constant as a draft model's.
    for evidence, taken in ((4.0, True), (6.0, False)):
        for free in (True, False):
            s = AdaptiveSchedule(8, free_drafter=free, priors={True: PRIORS, False: PRIORS},
                                 calibrations={True: (2.0, 1.0, 0.0, 0.0)},
                                 constants=ScheduleConstants(early_evidence=evidence))
            s.models[True].update_calibration(0, True)
            assert (s.models[True].confidence(0) > 0.3) is taken, (evidence, free)
    for bad in (0.5, float("nan")):
        with pytest.raises(ConfigError, match="early_evidence"):
            AcceptanceModel(PRIORS, early_evidence=bad)


def test_a_weighed_calibration_is_leaned_on_as_far_as_this_runs_outcomes_favour_it():
    lifted = (2.0, 1.0, 0.0, 0.0)  # bucket 1: ~0.76 where its prior says 0.3
    whole, weighed = (AcceptanceModel(PRIORS, calibration=lifted, weigh_calibration=w) for w in (False, True))
    for model in (whole, weighed):
        for _ in range(4):  # four rejected first tokens in bucket 1: the priors were right
            model.update([1], 0)
    # Taken whole, the refit is pulled up towards the lift (a: 0.55); weighed, the centre is all but the
    # priors as given (posterior weight ~0.01), so it fits as a model with nothing remembered does (-0.66).
    alone = AcceptanceModel(PRIORS)
    for _ in range(4):
        alone.update([1], 0)
    assert weighed.calibration == pytest.approx(alone.calibration, abs=0.05)
    assert whole.calibration[0] > weighed.calibration[0] + 1.0 and weighed.confidence(2) < whole.confidence(2) - 0.2
    # Outcomes that favour the calibration: weighed, it is taken (weight ~0.98) as a whole one is.
    whole, weighed = (AcceptanceModel(PRIORS, calibration=lifted, weigh_calibration=w) for w in (False, True))
    for model in (whole, weighed):
        for _ in range(4):
            model.update([1], 1)
    assert whole.calibration[0] > 2.0 and weighed.calibration[0] > 2.0
    # Prompt lookup's schedule weighs; a draft model's takes its calibration whole.
    lookup, draft = (AdaptiveSchedule(8, free_drafter=free, priors={True: PRIORS, False: PRIORS},
                                      calibrations={True: lifted}) for free in (True, False))
    for s in (lookup, draft):
        for _ in range(4):
            s.models[True].update([1], 0)
    assert lookup.models[True].calibration[0] < 0.0 < draft.models[True].calibration[0]


@pytest.mark.parametrize("bad", [(0.0, 1.0, 0.0), (0.0, 0.0, 0.0, 0.0), (float("nan"), 1.0, 0.0, 0.0)])
def test_a_calibration_out_of_range_is_refused(bad):
    with pytest.raises(ConfigError, match="calibration"):
        AcceptanceModel(PRIORS, calibration=bad)


def test_remember_stores_then_blends_and_recall_is_keyed():
    calibrations.remember("pair-a", {True: (1.0, 1.2, 0.3, -0.1)})
    assert calibrations.recall("pair-a") == {True: (1.0, 1.2, 0.3, -0.1)}
    calibrations.remember("pair-a", {True: (3.0, 1.2, 0.3, -0.1), False: (0.5, 1.0, 0.0, 0.0)})
    # Half way from what was stored: one odd generation does not decide the next run.
    assert calibrations.recall("pair-a") == {True: (2.0, 1.2, 0.3, -0.1), False: (0.5, 1.0, 0.0, 0.0)}
    assert calibrations.recall("pair-b") == {}
    assert calibrations.recall(None) == {}
    calibrations.remember(None, {True: (1.0, 1.0, 0.0, 0.0)})  # no key: nothing to write, no error


def _overlapping_remembers(monkeypatch, wait: float = 0.5) -> tuple[float, ...]:
    """Two threads remember different calibrations for one pair while each one's read is held up until
    the other has read too (where a lock lets it; else for ``wait`` seconds): what the store holds
    afterwards (greedy)."""
    calibrations.remember("pair-a", {True: (0.0, 1.0, 0.0, 0.0)})
    recall, both_read = calibrations.recall, threading.Barrier(2, timeout=wait)

    def slow_recall(key):
        stored = recall(key)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait()  # (under the lock the other can't read meanwhile: the wait times out)
        return stored

    monkeypatch.setattr(calibrations, "recall", slow_recall)
    threads = [threading.Thread(target=calibrations.remember, args=("pair-a", {True: (a, 1.0, 0.0, 0.0)}))
               for a in (4.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(calibrations, "recall", recall)
    return calibrations.recall("pair-a")[True]


def test_overlapping_runs_each_blend_their_calibration_in(monkeypatch):
    # One after the other: 0 -> 2 -> 2, or 0 -> 1 -> 2.5; both blends are in either way.
    assert _overlapping_remembers(monkeypatch)[0] in (2.0, 2.5)


def test_without_the_lock_overlapping_runs_lose_a_blend(monkeypatch):
    # The negative control of the test above: the same interleaving with the lock taken away.
    monkeypatch.setattr(calibrations, "FileLock", lambda *args, **kwargs: contextlib.nullcontext())
    # (Nothing holds either read up here, so the wait ends as both arrive: a long one only keeps a thread that
    # starts late on a busy machine from reading after the other wrote, which once read 0 -> 1 -> 2.5 in CI.)
    assert _overlapping_remembers(monkeypatch, wait=30.0)[0] in (1.0, 2.0)  # 0 -> 2 or 0 -> 1: one blend lost


def test_a_calibration_held_by_another_run_too_long_is_skipped(monkeypatch):
    monkeypatch.setattr(calibrations, "LOCK_SECONDS", 0.05)
    calibrations.remember("pair-a", {True: (1.0, 1.0, 0.0, 0.0)})
    lock_path = next(calibrations.store_dir().glob("*.json")).with_suffix(".lock")
    with calibrations.FileLock(lock_path):
        held = threading.Thread(target=calibrations.remember, args=("pair-a", {True: (3.0, 1.0, 0.0, 0.0)}))
        started = time.monotonic()
        held.start()
        held.join()
        assert time.monotonic() - started < 1.0  # it gave up rather than hang the run
    assert calibrations.recall("pair-a") == {True: (1.0, 1.0, 0.0, 0.0)}


def test_damaged_or_foreign_files_are_ignored():
    calibrations.remember("pair-a", {True: (1.0, 1.2, 0.3, -0.1)})
    (path,) = calibrations.store_dir().glob("*.json")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "greedy": [1.0, 99.0, 0.0, 0.0]}))  # s far out of bounds
    assert calibrations.recall("pair-a") == {}
    path.write_text(json.dumps({**data, "key": "pair-b"}))  # a hash collision or a hand-copied file
    assert calibrations.recall("pair-a") == {}
    path.write_text("{not json")
    assert calibrations.recall("pair-a") == {}


def test_engines_that_cant_name_themselves_keep_nothing(target, draft):
    assert calibrations.pair_key(target, AutoregressiveDrafter(draft)) is None  # in-memory engines


def test_the_key_names_both_models_and_the_drafter(tiny_engines):
    target, draft = tiny_engines
    by_model = calibrations.pair_key(target, AutoregressiveDrafter(draft))
    by_lookup = calibrations.pair_key(target, PromptLookupDrafter())
    assert by_model is not None and by_lookup is not None and by_model != by_lookup
    named = json.loads(by_model)
    assert named["draft"] == draft.profile_key and named["target"] == target.profile_key


# A target that plays back a trace with long copies (the simulation's copy-edit), on a virtual clock:
# the schedule sees the same outcomes on every machine. (A tiny random model's greedy text repeats
# itself or not depending on the CPU's float rounding: on one CI machine it never did, and nothing
# was proposed.) Such a target can't name itself, so the tests name the pair for it.
TRACE = next(t for t in synthetic_traces() if t.id == "copy-edit-0.01")
N = 200  # tokens: enough rounds on this trace for the lookup's calibration to learn from
KEY = "copy-edit trace against prompt lookup"


@pytest.fixture
def trace_target(monkeypatch):
    """A fresh copy-edit target per call; the pair is named KEY (calibrations.pair_key)."""
    monkeypatch.setattr(calibrations, "pair_key", lambda target, drafter: KEY)

    def make() -> tuple[TraceEngine, VirtualClock]:
        clock = VirtualClock()
        return TRACE.target(curve_profile("gpu-like"), clock), clock

    return make


def _lookup_decoder(trace_target, **options) -> SpeculativeDecoder:
    target, clock = trace_target()
    return SpeculativeDecoder(target, PromptLookupDrafter(), clock=clock, **options)


def test_a_decoder_passes_what_it_learned_to_the_next(trace_target):
    first = _lookup_decoder(trace_target)
    assert first.schedule.models[True].calibration == (0.0, 1.0, 0.0, 0.0)  # nothing remembered yet
    out = first.generate(TRACE.prompt, N, ignore_eog=True)
    assert out.tokens == TRACE.output[:N]  # remembering never changes the output
    learned = first.schedule.models[True].own_fit()  # (what its outcomes say: see the test below)
    assert first.schedule.models[True].outcomes >= calibrations.MIN_OBSERVATIONS
    assert learned != (0.0, 1.0, 0.0, 0.0)  # (else the check below could not tell a write from none)
    assert calibrations.recall(KEY) == {True: pytest.approx(learned)}
    second = _lookup_decoder(trace_target)
    assert second.schedule.models[True].centre == pytest.approx(learned)
    assert second.generate(TRACE.prompt, N, ignore_eog=True).tokens == TRACE.output[:N]


@pytest.mark.parametrize("finish", ["close", "resume"])
def test_the_calibration_is_passed_on_once_the_last_tokens_are_out(trace_target, monkeypatch, finish):
    """The store is written after the final event reaches the caller, whether the caller closes the stream
    there (as the server and ``specdec run`` do) or reads on to its end: no token waits for the write, and
    its time is not generation time. Fails if the write came before the final event, was skipped on close,
    or counted in generation_seconds (the write here takes 1 s of the virtual clock)."""
    decoder = _lookup_decoder(trace_target)
    clock = decoder.clock
    writes = []
    remember = calibrations.remember

    def slow_remember(key, learned, short=None, draft_scale=None, tested=None, draft_overhead=None):
        clock.advance(1.0)
        writes.append(key)
        remember(key, learned, short, draft_scale, tested, draft_overhead)

    monkeypatch.setattr(calibrations, "remember", slow_remember)
    start = clock()
    stream = decoder.stream(TRACE.prompt, N, ignore_eog=True)
    last = None
    for last in stream:
        if last.stop_reason is not None:
            break
    assert last is not None and last.stop_reason == "length"
    assert writes == []  # the final event is out before anything is written
    out_at, generation = clock() - start, last.stats.generation_seconds
    if finish == "close":
        stream.close()
    else:
        assert next(stream, None) is None
    assert writes == [KEY]
    assert calibrations.recall(KEY) == {True: pytest.approx(decoder.schedule.models[True].own_fit())}
    assert clock() - start == pytest.approx(out_at + 1.0)  # (the write's second came after the last tokens)
    assert last.stats.generation_seconds == generation <= out_at


def test_without_the_cache_nothing_is_read_or_written(trace_target):
    _lookup_decoder(trace_target, profile_cache=False).generate(TRACE.prompt, N, ignore_eog=True)
    assert not calibrations.store_dir().exists() or not any(calibrations.store_dir().iterdir())
    calibrations.remember(KEY, {True: (1.5, 1.0, 0.0, 0.0)})
    assert _lookup_decoder(trace_target, profile_cache=False).schedule.models[True].centre == (0.0, 1.0, 0.0, 0.0)


def test_a_decoder_passes_on_each_outcome_once(trace_target, monkeypatch):
    """A second, short generation on the same decoder adds too few new outcomes to pass its calibration on
    again (fails if the outcomes already passed on were counted anew)."""
    passed = []
    remember = calibrations.remember
    monkeypatch.setattr(calibrations, "remember", lambda key, learned, short=None, draft_scale=None, tested=None,
                        draft_overhead=None: (passed.append(dict(learned)),
                                              remember(key, learned, short, draft_scale, tested, draft_overhead)))
    decoder = _lookup_decoder(trace_target)
    decoder.generate(TRACE.prompt, N, ignore_eog=True)
    decoder.generate(TRACE.prompt, 2, ignore_eog=True)
    assert [bool(learned) for learned in passed] == [True, False]


def test_a_generation_that_learned_little_leaves_the_store_alone(trace_target):
    decoder = _lookup_decoder(trace_target)
    decoder.generate(TRACE.prompt, 2, ignore_eog=True)  # one or two rounds: a guess
    assert decoder.schedule.models[True].outcomes < calibrations.MIN_OBSERVATIONS
    assert calibrations.recall(KEY) == {}


def test_remember_false_neither_reads_nor_writes_the_calibration(trace_target):
    calibrations.remember(KEY, {True: (1.5, 1.0, 0.0, 0.0)})
    fresh = _lookup_decoder(trace_target, remember=False)
    assert fresh.schedule.models[True].centre == (0.0, 1.0, 0.0, 0.0)
    fresh.generate(TRACE.prompt, N, ignore_eog=True)
    assert fresh.schedule.models[True].outcomes >= calibrations.MIN_OBSERVATIONS  # it had something to write
    assert calibrations.recall(KEY) == {True: (1.5, 1.0, 0.0, 0.0)}  # nothing written
    assert _lookup_decoder(trace_target).schedule.models[True].centre == (1.5, 1.0, 0.0, 0.0)


def test_remember_false_still_uses_the_cached_profiles(tiny_engines, tmp_path, monkeypatch):
    target, _ = tiny_engines
    # A profile in a cache of this test's own for this target (one measured here could be refused as
    # implausible on a busy machine, and then not cached; one put in the shared cache would be read
    # by later tests).
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    save(CostProfile({1: 1e-4, 2: 1.1e-4, 3: 1.2e-4}, key=target.profile_key))
    fresh = SpeculativeDecoder(target, PromptLookupDrafter(), remember=False)
    assert fresh.schedule.profile is not None and fresh.schedule.profile.from_cache
    assert fresh.schedule.profile.seconds == {1: 1e-4, 2: 1.1e-4, 3: 1.2e-4}


def test_only_what_rests_on_enough_new_outcomes_is_kept():
    """One rule for the decoder and the simulation: a calibration is passed on only when at least
    MIN_OBSERVATIONS outcomes came since the last one passed on (fails if `kept` is ignored)."""
    from specdec_gguf.calibrations import MIN_OBSERVATIONS, blended, worth_keeping

    cal = (0.5, 1.2, 0.1, 0.2)
    learned = {True: (cal, MIN_OBSERVATIONS + 10), False: (cal, MIN_OBSERVATIONS - 1)}
    assert set(worth_keeping(learned)) == {True}
    assert worth_keeping(learned, {True: 11}) == {}  # only 31 new outcomes since the last pass-on
    assert worth_keeping(learned, {True: 10}) == {True: (cal, MIN_OBSERVATIONS + 10)}
    stored = blended({}, {True: cal})
    assert stored == {True: cal}
    moved = blended(stored, {True: (1.5, 1.2, 0.1, 0.2)})
    assert moved[True][0] == 1.0 and stored[True][0] == 0.5  # half way, and the input is left as it was
    assert blended(stored, {True: (float("nan"), 1.0, 0.0, 0.0)}) == stored  # no calibration: skipped


def test_a_run_passes_on_what_its_own_outcomes_say_not_the_remembered_calibration():
    """What the store blends is each run's fit around the drafter's priors as given: a fit centred on the
    remembered calibration, blended back into the store run after run, compounded (simulated in turn, a
    user's cache: prompt lookup's worst trace 0.822x plain with it, 0.904x without). The run itself still
    pulls towards the remembered one. Fails if ``learned`` passed on the remembered-centred fit."""
    remembered_cal = (2.0, 1.0, 0.0, 0.0)
    with_memory = AcceptanceModel(PRIORS, calibration=remembered_cal)
    alone = AcceptanceModel(PRIORS)
    for model in (with_memory, alone):
        for _ in range(6):
            model.update([0, 1, 2], 1)
    assert with_memory.own_fit() == pytest.approx(alone.fitted(), abs=1e-6)
    assert with_memory.fitted()[0] > alone.fitted()[0] + 0.3  # (its own estimate is pulled towards the memory)
    schedule = AdaptiveSchedule(8, priors={True: PRIORS, False: PRIORS}, calibrations={True: remembered_cal})
    for _ in range(6):
        schedule.models[True].update([0, 1, 2], 1)
    passed_on, outcomes = schedule.learned()[True]
    assert passed_on == pytest.approx(alone.fitted(), abs=1e-6) and outcomes == alone.outcomes


def _counts(**per_slot: float) -> tuple[list[float], list[float]]:
    """Per-slot (hits, outcomes) for PRIORS' four buckets, all outcomes right: ``s1=10`` is ten in slot 1."""
    hits = [0.0] * (3 * len(PRIORS))
    for name, n in per_slot.items():
        hits[int(name[1:])] = n
    return hits, list(hits)


def test_short_runs_leave_their_outcomes_pending_until_they_teach_a_calibration_together():
    """A run with fewer than MIN_OBSERVATIONS outcomes (a draft only looked at: 3-10 a run) keeps them
    pending; once runs together hold enough, the calibration they say is blended in and they are cleared.
    Fails if short runs' outcomes are dropped (every such run is then as blind as the first)."""
    short = {True: (_counts(s1=10.0), PRIORS)}  # ten right first tokens where the prior said 0.3
    stored = calibrations.Stored()
    for _ in range(3):
        stored = calibrations.passed_on(stored, {}, short)
    assert stored.calibrations == {} and sum(stored.pending[True][1]) == 30 < calibrations.MIN_OBSERVATIONS
    stored = calibrations.passed_on(stored, {}, short)
    assert stored.pending == {}
    together = AcceptanceModel(PRIORS).fit_counts(*_counts(s1=40.0))
    assert stored.calibrations == {True: pytest.approx(together)}
    assert together[0] > 0.5  # right where the priors said 0.3: the calibration lifts them
    # A run that learned enough on its own is blended in as before, pending outcomes left waiting.
    stored = calibrations.passed_on(stored, {True: (1.0, 1.0, 0.0, 0.0)}, {False: (_counts(s2=5.0), PRIORS)})
    assert stored.calibrations[True] == pytest.approx(calibrations.blend(together, (1.0, 1.0, 0.0, 0.0)))
    assert sum(stored.pending[False][1]) == 5 and True not in stored.pending


def test_pending_outcomes_are_stored_beside_the_calibration_and_damaged_ones_ignored():
    calibrations.remember("pair-a", {True: (1.0, 1.2, 0.3, -0.1)}, {True: (_counts(s1=4.0), PRIORS)})
    assert calibrations.recall("pair-a") == {True: (1.0, 1.2, 0.3, -0.1)}  # (pending: not a calibration yet)
    calibrations.remember("pair-a", {}, {True: (_counts(s1=4.0, s5=2.0), PRIORS)})
    assert calibrations.recall_all("pair-a").pending == {True: _counts(s1=8.0, s5=2.0)}
    (path,) = calibrations.store_dir().glob("*.json")
    data = json.loads(path.read_text())
    data["pending"]["greedy"]["hits"][1] = 99.0  # more hits than outcomes: a damaged file
    path.write_text(json.dumps(data))
    assert calibrations.recall_all("pair-a").pending == {}
    assert calibrations.recall("pair-a") == {True: (1.0, 1.2, 0.3, -0.1)}  # the calibration still stands


def test_a_draft_price_scale_is_stored_blended_and_bounded():
    """The draft price scale a run passes on (DraftPrice.take_scale) is kept beside the calibrations and
    blended in as they are; one out of bounds in the file is ignored, and a run that passes on only a
    calibration keeps the stored scale. Fails if the scale were dropped or replaced rather than blended."""
    calibrations.remember("pair-a", {}, None, 2.0)
    assert calibrations.recall_all("pair-a").draft_scale == 2.0
    calibrations.remember("pair-a", {True: (1.0, 1.2, 0.3, -0.1)})
    assert calibrations.recall_all("pair-a").draft_scale == 2.0
    calibrations.remember("pair-a", {}, None, 1.0)
    assert calibrations.recall_all("pair-a") == calibrations.Stored({True: (1.0, 1.2, 0.3, -0.1)}, {}, 1.5)
    (path,) = calibrations.store_dir().glob("*.json")
    data = json.loads(path.read_text())
    for bad in (99.0, -1.0, "2", True, None):
        path.write_text(json.dumps({**data, "draft_scale": bad}))
        assert calibrations.recall_all("pair-a").draft_scale is None
        assert calibrations.recall("pair-a") == {True: (1.0, 1.2, 0.3, -0.1)}  # the rest still stands


def test_a_draft_proposals_overhead_is_stored_blended_and_bounded():
    """The overhead a run passes on (DraftPrice.take_overhead) is kept beside the scale and blended in as it
    is; one out of bounds in the file is ignored, and a run that passes on none keeps the stored one. Fails
    if it were dropped, replaced rather than blended, or read unchecked."""
    calibrations.remember("pair-a", {}, None, 1.2, None, 8.0)
    stored = calibrations.recall_all("pair-a")
    assert (stored.draft_scale, stored.draft_overhead) == (1.2, 8.0)
    calibrations.remember("pair-a", {}, None, 1.2)
    assert calibrations.recall_all("pair-a").draft_overhead == 8.0
    calibrations.remember("pair-a", {}, None, None, None, 4.0)
    assert calibrations.recall_all("pair-a").draft_overhead == 6.0
    (path,) = calibrations.store_dir().glob("*.json")
    data = json.loads(path.read_text())
    for bad in (99.0, -1.0, "2", True, None, float("nan")):
        path.write_text(json.dumps({**data, "draft_overhead": bad}))
        assert calibrations.recall_all("pair-a").draft_overhead is None
        assert calibrations.recall_all("pair-a").draft_scale == 1.2  # the rest still stands


def _draft_decoder(monkeypatch, slower: float = 1.0, overhead: float = 0.0, **options) -> SpeculativeDecoder:
    """A decoder with a draft that is always right at probabilities that undersell it (0.2), on the
    copy-edit trace with big-q8's costs, both profiles known (as a calibrated run's are). The draft's
    passes take ``slower`` times what its profile says, and each proposal ``overhead`` of a target step more."""
    from specdec_gguf import decoder as decoder_module
    from specdec_gguf.engines.simulated import SimulatedDraftEngine

    costs = curve_profile("big-q8")
    draft_costs = CostProfile({1: 0.1 * costs.cost(1), 2: 0.12 * costs.cost(1)})
    monkeypatch.setattr(decoder_module, "profile_for", lambda engine, use_cache=True:
                        draft_costs if isinstance(engine, SimulatedDraftEngine) else costs)
    clock = VirtualClock()
    full = TRACE.prompt + TRACE.output
    runs_at = CostProfile({n: slower * seconds for n, seconds in draft_costs.seconds.items()})
    draft = SimulatedDraftEngine(full, [True] * len(full), [0.2] * len(full), TRACE.n_vocab, runs_at, clock,
                                 overhead=overhead * costs.cost(1))
    return SpeculativeDecoder(TRACE.target(costs, clock), AutoregressiveDrafter(draft), clock=clock, **options)


def test_what_a_draft_costs_in_a_run_is_passed_on_to_the_next_run(trace_target, monkeypatch):
    """The draft runs at twice its profile's price: a generation's proposals say so, the store keeps it, and
    the next decoder prices a draft token so from its first round (a fresh decoder per answer, as
    ``specdec run`` starts, otherwise never learns it where it drafts a few times an answer). Without the
    cache, or with the constant off, the price is the profile's. Fails if the scale were not passed on or
    not read."""
    first = _draft_decoder(monkeypatch, slower=2.0)
    profiled = first.schedule.draft_price.per_token
    first.generate(TRACE.prompt, 64, ignore_eog=True)
    scale = calibrations.recall_all(KEY).draft_scale
    assert scale is not None and 1.6 < scale < 2.4
    assert _draft_decoder(monkeypatch).schedule.draft_price.per_token == pytest.approx(scale * profiled)
    off = ScheduleConstants(remember_draft_price=False)
    assert _draft_decoder(monkeypatch, constants=off).schedule.draft_price.per_token == pytest.approx(profiled)
    assert _draft_decoder(monkeypatch, remember=False).schedule.draft_price.per_token == pytest.approx(profiled)


def test_what_each_proposal_costs_beyond_its_passes_is_passed_on_to_the_next_run(trace_target, monkeypatch):
    """Each proposal costs 0.1 of a target step (the draft's one-token pass) more than its passes: a
    generation's proposals say so, the store keeps it, and the next decoder prices a proposal's start with
    it from its first round, a further token at the profile's price. Fails if the overhead were not fitted,
    not passed on or not read."""
    first = _draft_decoder(monkeypatch, overhead=0.1)
    profiled = first.schedule.draft_price.start, first.schedule.draft_price.per_token
    first.generate(TRACE.prompt, 64, ignore_eog=True)
    stored = calibrations.recall_all(KEY)
    assert stored.draft_overhead is not None and stored.draft_overhead == pytest.approx(1.0, rel=0.05)
    price = _draft_decoder(monkeypatch).schedule.draft_price
    one = curve_profile("big-q8").cost(1) * 0.1
    assert price.start == pytest.approx(profiled[0] * stored.draft_scale + stored.draft_overhead * one)
    assert price.per_token == pytest.approx(profiled[1] * stored.draft_scale)
    assert stored.draft_scale == pytest.approx(1.0, abs=0.05)


def test_a_draft_models_short_generations_pass_on_only_their_new_outcomes(trace_target, monkeypatch):
    decoder = _draft_decoder(monkeypatch)
    decoder.generate(TRACE.prompt, 16, ignore_eog=True)
    model = decoder.schedule.models[True]
    first = model.outcomes
    assert 0 < first < calibrations.MIN_OBSERVATIONS
    assert sum(calibrations.recall_all(KEY).pending[True][1]) == first
    decoder.generate(TRACE.prompt, 16, ignore_eog=True)  # the same decoder again: only what is new is added
    assert first < model.outcomes < calibrations.MIN_OBSERVATIONS
    assert sum(calibrations.recall_all(KEY).pending[True][1]) == model.outcomes
    assert calibrations.recall(KEY) == {}
    # A third short generation brings the pending outcomes past the minimum: they teach a calibration.
    decoder.generate(TRACE.prompt, 16, ignore_eog=True)
    assert calibrations.recall_all(KEY).pending == {}
    assert calibrations.recall(KEY)[True][0] > 0.5  # always right where the priors said 0.15
    # Prompt lookup's runs leave nothing pending (its looks cost nothing: no run of it is blind).
    lookup = _lookup_decoder(trace_target)
    lookup.generate(TRACE.prompt, 2, ignore_eog=True)
    assert lookup.schedule.models[True].outcomes > 0 and calibrations.recall_all(KEY).pending == {}


def test_the_key_changes_with_the_drafters_priors(tiny_engines):
    """A calibration is of the drafter's priors: one fitted to other priors (an earlier version's) must not
    be recalled. Fails if the key named only how many buckets there are."""
    target, draft = tiny_engines

    class OtherPriors(AutoregressiveDrafter):
        def acceptance_priors(self, greedy):
            return tuple(min(0.99, p + 0.05) for p in super().acceptance_priors(greedy))

    assert calibrations.pair_key(target, OtherPriors(draft)) != calibrations.pair_key(target, AutoregressiveDrafter(draft))


def test_a_track_record_is_kept_of_the_runs_that_tested_the_stored_calibration():
    """Each run that started from the stored calibration leaves a verdict: whether the calibration predicted its
    outcomes better than the priors as given. The odds the record gives grow with runs that agree and fall with
    one that disagrees; a verdict where nothing is stored, or a damaged record, is ignored. Fails if the verdicts
    were not kept, or counted the same whatever they said."""
    assert calibrations.recall_all("pair-a").odds(True) == 1.0  # nothing stored: even odds
    calibrations.remember("pair-a", {}, tested={True: 3.0})
    assert calibrations.recall_all("pair-a").record == {}  # (no calibration stored: nothing was tested)
    calibrations.remember("pair-a", {True: (1.0, 1.2, 0.3, -0.1)})
    odds = [1.0]
    for _ in range(4):
        calibrations.remember("pair-a", {}, tested={True: 2.5})
        odds.append(calibrations.recall_all("pair-a").odds(True))
    assert odds == sorted(odds) and odds[1] == 2.0 and odds[-1] > 4.0
    assert calibrations.recall_all("pair-a").odds(False) == 1.0  # (sampled: untested)
    calibrations.remember("pair-a", {}, tested={True: -4.0})  # one that disagrees: about half the odds
    stored = calibrations.recall_all("pair-a")
    assert 0.4 * odds[-1] < stored.odds(True) < 0.6 * odds[-1]
    assert stored.calibrations == {True: (1.0, 1.2, 0.3, -0.1)}
    for _ in range(3):
        calibrations.remember("pair-a", {}, tested={True: -1.0})
    assert calibrations.recall_all("pair-a").odds(True) < 1.0  # a record of disagreeing runs: below even odds
    (path,) = calibrations.store_dir().glob("*.json")
    data = json.loads(path.read_text())
    for bad in ([5.0, 2.0], [-1.0, 2.0], [1.0, 99.0], [True, 2.0], "1,2", [1.0], [float("nan"), 1.0]):
        path.write_text(json.dumps({**data, "record": {"greedy": bad}}))
        assert calibrations.recall_all("pair-a").record == {}
        assert calibrations.recall("pair-a") == {True: (1.0, 1.2, 0.3, -0.1)}  # the rest still stands


def test_a_run_tests_the_calibration_it_started_from_on_its_own_outcomes():
    """tested_of: the log-likelihood ratio of a run's outcomes under the stored calibration against the priors
    as given, for runs with enough outcomes and a stored calibration only. Fails if the sign did not follow
    which of the two predicted the outcomes better."""
    model = AcceptanceModel(PRIORS, calibration=(2.0, 1.0, 0.0, 0.0))  # (surer than the priors everywhere)
    slots = 3 * len(PRIORS)
    outcomes = [0.0] * slots
    outcomes[1] = calibrations.MIN_RECORD_OUTCOMES
    right, wrong = list(outcomes), [0.0] * slots  # bucket 1's first tokens: all accepted, or none
    assert calibrations.tested_of({True: model}, {True: ((right, outcomes), PRIORS)})[True] > 0
    assert calibrations.tested_of({True: model}, {True: ((wrong, outcomes), PRIORS)})[True] < 0
    few = [0.0] * slots
    few[1] = calibrations.MIN_RECORD_OUTCOMES - 1
    assert calibrations.tested_of({True: model}, {True: ((few, few), PRIORS)}) == {}
    assert calibrations.tested_of({True: AcceptanceModel(PRIORS)}, {True: ((right, outcomes), PRIORS)}) == {}
    with pytest.raises(ConfigError, match="slots"):
        model.evidence_of([1.0], [1.0])


def test_a_calibration_earlier_runs_agreed_with_is_taken_on_less_evidence():
    """Prior odds start the evidence for a remembered calibration: at odds of 2 one right first token (a
    likelihood ratio of ~4.5) takes it, where even odds need two; odds below even need more; odds at or past
    early_evidence start the model at it. Fails if the odds were ignored."""
    calibration = (2.0, 1.0, 0.0, 0.0)
    vouched = AcceptanceModel(PRIORS, calibration=calibration, prior_odds=2.0)
    fresh = AcceptanceModel(PRIORS, calibration=calibration)
    doubted = AcceptanceModel(PRIORS, calibration=calibration, prior_odds=0.2)
    for model in (vouched, fresh, doubted):
        assert round(model.confidence(0), 6) == PRIORS[0]
        model.update_calibration(0, True)
    assert vouched.confidence(0) > 0.3 and round(fresh.confidence(0), 6) == PRIORS[0]
    for model in (fresh, doubted):
        model.update_calibration(0, True)
    assert fresh.confidence(0) > 0.3 and round(doubted.confidence(0), 6) == PRIORS[0]
    trusted = AcceptanceModel(PRIORS, calibration=calibration, prior_odds=6.0)
    assert trusted.confidence(0) > 0.4 and trusted.calibration == pytest.approx(calibration)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="prior_odds"):
            AcceptanceModel(PRIORS, calibration=calibration, prior_odds=bad)


def test_a_draft_models_runs_build_a_track_record_the_next_decoder_reads(trace_target, monkeypatch):
    """Runs of a pair whose draft is always right at probabilities that undersell it (0.2): the first teaches
    the calibration, the next ones agree with it, and a fresh decoder takes the calibration on less evidence
    of its own, the record's odds bounded (ScheduleConstants.record_odds_bound; 1: the record unread). Prompt
    lookup (whether an answer copies is the prompt's) keeps even odds. Fails if the record were not kept, not
    read or not bounded."""
    for _ in range(4):
        _draft_decoder(monkeypatch).generate(TRACE.prompt, 48, ignore_eog=True)
    stored = calibrations.recall_all(KEY)
    assert stored.odds(True) > 2.0
    bound = ScheduleConstants().record_odds_bound
    assert 1.0 < bound < ScheduleConstants().early_evidence
    vouched = _draft_decoder(monkeypatch).schedule.models[True]
    unread = _draft_decoder(monkeypatch, constants=ScheduleConstants(record_odds_bound=1.0)).schedule.models[True]
    taken_after = []
    for model in (vouched, unread):  # (neither starts at the calibration: the bound is below early_evidence)
        assert model.confidence(2) == pytest.approx(model.priors[2])
        rights = 0
        while model.confidence(2) == pytest.approx(model.priors[2]):
            model.update_calibration(2, True)  # right first tokens where the priors said little
            rights += 1
        taken_after.append(rights)
    assert taken_after[0] < taken_after[1] < 4  # (before the first regular refit, at four updates)
    lookup = AdaptiveSchedule(16, target_costs=curve_profile("gpu-like"), free_drafter=True,
                              priors={True: PRIORS, False: PRIORS}, calibrations={True: (2.0, 1.0, 0.0, 0.0)},
                              calibration_odds={True: 2.0})
    lookup.models[True].update_calibration(0, True)
    assert round(lookup.models[True].confidence(0), 6) == PRIORS[0]
