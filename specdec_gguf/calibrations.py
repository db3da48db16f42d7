"""Calibrations kept across runs: how well a drafter agrees with a target, so a run starts knowing.

A drafter's buckets come with priors (a draft model's own probability of its token); the
adaptive schedule calibrates them online (confidence.py). That takes rounds, and
``specdec run`` starts a fresh decoder every time: a draft whose probabilities undersell it
(a random-weight draft is right 80% of the time at probability 0.05-0.3) was verified one or
two tokens at a time for the first dozen rounds of every run, most of a short answer. So
the pooled calibration ``(a, s, d₁, d₂)`` a generation learned is kept in the user cache,
per target and drafter (their model files, settings, build and threads:
``TextModel.profile_key``), and the next run's calibration starts from it and is pulled
towards it instead of towards the priors as given. Each kept generation moves the stored
calibration part of the way: one odd prompt does not decide the next run.

A generation too short to teach a calibration alone (fewer than ``MIN_OBSERVATIONS`` outcomes: a
draft that is only looked at sees 3-10 in an answer) leaves its outcomes per slot *pending* beside
the calibration; once the pending outcomes of several runs reach the minimum, the calibration they
say together is blended in as one generation's. Without that, a draft whose own probabilities
undersell it and whose first run learned nothing left every later run as blind.

Beside it the store keeps the calibration's *track record*: of the runs that started from a stored
calibration, how many it predicted better than the priors as given (decayed counts, ``Stored.odds``). A
draft model's next run takes those odds, bounded, as its prior belief in the calibration
(``AcceptanceModel(prior_odds=)``, ``ScheduleConstants.record_odds_bound``): a pair whose runs agreed takes
it on less evidence of its own, one whose runs disagreed (agreement that is the prompt's) on more.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from filelock import FileLock, Timeout

from .confidence import AcceptanceModel
from .engine import DrafterEngine, SpeculativeEngine, is_text_model
from .profile import cache_dir, write_cache_file

FORMAT = 1
# Outcomes (verified tokens, and declined first tokens checked against the plain step) a
# generation must have seen before what it learned is kept: fewer are a guess.
MIN_OBSERVATIONS = 32
# Share of the way each kept generation moves the stored calibration towards its own.
BLEND = 0.5
# What a stored calibration may say (a, s, d₁, d₂); outside: a damaged file, ignored. s >= 0.1
# keeps the priors' order, as the online fit does.
_BOUNDS = ((-8.0, 8.0), (0.1, 8.0), (-6.0, 6.0), (-6.0, 6.0))
# What a stored draft price scale may say (costfit.DraftPrice.take_scale); outside: a damaged file, ignored.
_SCALE_BOUNDS = (0.25, 8.0)
# ... and a stored overhead of a proposal, in the draft profile's one-token passes (DraftPrice.take_overhead).
_OVERHEAD_BOUNDS = (0.0, 64.0)
# A run's outcomes (at least this many) say whether the stored calibration it started from predicted them
# better than the priors as given; the track record keeps those verdicts, each older one counting this much less.
MIN_RECORD_OUTCOMES = 8
RECORD_DECAY = 0.9
# Seconds a run waits for another one's read-blend-write of the same calibration before it skips its own.
LOCK_SECONDS = 2.0

Calibration = tuple[float, float, float, float]
Counts = tuple[list[float], list[float]]  # per slot of an AcceptanceModel: hits, outcomes (AcceptanceModel.counts)
_POLICIES = ((True, "greedy"), (False, "sampled"))


@dataclass(frozen=True)
class Stored:
    """What the store holds for a pair, per policy (True: greedy): the calibration, and the outcomes of
    runs too short to teach one alone, pending until enough are in; and for a draft model, what its
    proposals cost in runs over what its profile says (``costfit.DraftPrice.take_scale``; None: not known); and
    per policy the calibration's track record: decayed counts of the runs it predicted better than the priors
    as given, and of the runs that tested it (``odds``); and what each proposal costs beyond its profile's
    passes (``costfit.DraftPrice.take_overhead``, in the profile's one-token passes; None: not known)."""

    calibrations: dict[bool, Calibration] = field(default_factory=dict)
    pending: dict[bool, Counts] = field(default_factory=dict)
    draft_scale: float | None = None
    record: dict[bool, tuple[float, float]] = field(default_factory=dict)
    draft_overhead: float | None = None

    def odds(self, greedy: bool) -> float:
        """The odds the track record gives that the stored calibration describes the next run rather than
        the priors as given: (agreed + 1) / (disagreed + 1), 1 with no record."""
        agreed, runs = self.record.get(greedy, (0.0, 0.0))
        return (agreed + 1.0) / (runs - agreed + 1.0)

    def calibration_odds(self) -> dict[bool, float]:
        """``odds`` per policy with a stored calibration (``AdaptiveSchedule(calibration_odds=)``)."""
        return {greedy: self.odds(greedy) for greedy in self.calibrations}


def pair_key(target: SpeculativeEngine, drafter: DrafterEngine) -> str | None:
    """The cache key of ``drafter`` against ``target``; None when either can't name itself (an
    engine that is not a ``TextModel``) or the drafter has no buckets to calibrate."""
    draft = drafter.cost_engine
    if not is_text_model(target) or (draft is not None and not is_text_model(draft)):
        return None
    # A calibration is of the drafter's priors: one fitted to other priors (an earlier version's) would
    # mislead, so the priors are part of the key.
    priors = [[round(float(p), 6) for p in drafter.acceptance_priors(greedy)] for greedy in (True, False)]
    if not all(priors):
        return None
    return json.dumps({"target": target.profile_key, "drafter": drafter.name, "priors": priors,
                       "draft": draft.profile_key if draft is not None else None}, sort_keys=True)


def store_dir() -> Path:
    """Where calibrations are kept: beside the cost profiles (profile.cache_dir)."""
    return cache_dir().parent / "calibrations"


def _path_for(key: str) -> Path:
    return store_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _valid(values: object) -> Calibration | None:
    if not isinstance(values, list) or len(values) != 4:
        return None
    try:
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(v) and lo <= v <= hi for v, (lo, hi) in zip(numbers, _BOUNDS)):
        return None
    return numbers  # type: ignore[return-value]


def _valid_counts(values: object) -> Counts | None:
    if not isinstance(values, dict):
        return None
    try:
        hits, outcomes = ([float(v) for v in values[name]] for name in ("hits", "outcomes"))
    except (KeyError, TypeError, ValueError):
        return None
    if len(hits) != len(outcomes) or not all(math.isfinite(o) and 0.0 <= h <= o for h, o in zip(hits, outcomes)):
        return None
    return hits, outcomes


def _valid_bounded(value: object, bounds: tuple[float, float] = _SCALE_BOUNDS) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    lo, hi = bounds
    return float(value) if math.isfinite(value) and lo <= value <= hi else None


def _valid_record(value: object) -> tuple[float, float] | None:
    if not isinstance(value, list) or len(value) != 2 or any(isinstance(v, bool) for v in value):
        return None
    try:
        agreed, runs = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    return (agreed, runs) if math.isfinite(runs) and 0.0 <= agreed <= runs <= 1.0 / (1.0 - RECORD_DECAY) else None


def recall(key: str | None) -> dict[bool, Calibration]:
    """The stored calibrations for greedy (True) and sampled (False) decoding under ``key``; those
    missing, unreadable, stored for another key or out of bounds are left out."""
    return recall_all(key).calibrations


def recall_all(key: str | None) -> Stored:
    """All that is stored under ``key``: the calibrations, pending outcomes, track record and draft price
    (scale and overhead; what is missing, unreadable or out of bounds left out)."""
    if key is None:
        return Stored()
    try:
        data = json.loads(_path_for(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Stored()
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return Stored()
    pending = data.get("pending") if isinstance(data.get("pending"), dict) else {}
    record = data.get("record") if isinstance(data.get("record"), dict) else {}
    found = {greedy: (_valid(data.get(name)), _valid_counts(pending.get(name)), _valid_record(record.get(name)))
             for greedy, name in _POLICIES}
    return Stored({greedy: cal for greedy, (cal, _, _) in found.items() if cal is not None},
                  {greedy: counts for greedy, (_, counts, _) in found.items() if counts is not None},
                  _valid_bounded(data.get("draft_scale")),
                  {greedy: kept for greedy, (_, _, kept) in found.items() if kept is not None},
                  _valid_bounded(data.get("draft_overhead"), _OVERHEAD_BOUNDS))


def blend(old: Sequence[float] | None, new: Sequence[float]) -> Calibration | None:
    """``old`` moved ``BLEND`` of the way to ``new`` (``new`` itself when there is no ``old``), within
    bounds; None if the result is no calibration (not finite)."""
    moved = [_toward(None if old is None else old[i], float(v)) for i, v in enumerate(new)]
    return _valid([min(max(v, lo), hi) for v, (lo, hi) in zip(moved, _BOUNDS)])


def _toward(old: float | None, new: float) -> float:
    """``old`` moved ``BLEND`` of the way to ``new`` (``new`` where there is no ``old``): one kept value's blend."""
    return new if old is None else old + BLEND * (new - old)


def worth_keeping(learned: Mapping[bool, tuple[Sequence[float], int]],
                  kept: Mapping[bool, int] | None = None) -> dict[bool, tuple[Sequence[float], int]]:
    """Per policy, the (calibration, outcomes) a schedule learned (``AdaptiveSchedule.learned``) that
    rest on at least ``MIN_OBSERVATIONS`` outcomes beyond the ``kept`` ones (already passed on)."""
    kept = kept or {}
    return {greedy: (calibration, outcomes) for greedy, (calibration, outcomes) in learned.items()
            if outcomes - kept.get(greedy, 0) >= MIN_OBSERVATIONS}


def blended(stored: Mapping[bool, Calibration], learned: Mapping[bool, Sequence[float]]) -> dict[bool, Calibration]:
    """``stored`` with each of ``learned`` blended in (see blend; a result that is no calibration is skipped)."""
    out = dict(stored)
    for greedy, cal in learned.items():
        moved = blend(out.get(greedy), cal)
        if moved is not None:
            out[greedy] = moved
    return out


def passed_on(stored: Stored, learned: Mapping[bool, Sequence[float]],
              short: Mapping[bool, tuple[Counts, Sequence[float]]] | None = None,
              draft_scale: float | None = None, tested: Mapping[bool, float] | None = None,
              draft_overhead: float | None = None) -> Stored:
    """``stored`` after a run passed on ``learned`` (per policy, a calibration resting on enough outcomes:
    blended in) and ``short`` (per policy, the (counts, bucket priors) of a run with too few, as
    ``pending_of`` picks them: added to what is pending; once that holds ``MIN_OBSERVATIONS`` outcomes, the calibration they say together,
    fitted around the priors as given, is blended in and they are cleared), ``draft_scale`` (the run's
    draft price scale and ``draft_overhead`` its overhead: each blended in as a calibration is, within bounds)
    and ``tested`` (per policy, how much better the stored calibration the run started from predicted its
    outcomes than the priors as given, as ``tested_of`` gives it: a verdict added to the track record; ignored
    where nothing is stored)."""
    record = dict(stored.record)
    for greedy, evidence in (tested or {}).items():
        if greedy in stored.calibrations and math.isfinite(evidence):  # (a verdict on what is stored)
            agreed, runs = record.get(greedy, (0.0, 0.0))
            record[greedy] = (RECORD_DECAY * agreed + (evidence > 0.0), RECORD_DECAY * runs + 1.0)
    calibrations = blended(stored.calibrations, learned)
    pending = dict(stored.pending)
    for greedy, ((hits, outcomes), priors) in (short or {}).items():
        old = pending.get(greedy)
        if old is not None and len(old[0]) == len(hits):  # (another length: another drafter's, dropped)
            hits, outcomes = [a + b for a, b in zip(old[0], hits)], [a + b for a, b in zip(old[1], outcomes)]
        if sum(outcomes) < MIN_OBSERVATIONS:
            pending[greedy] = (list(hits), list(outcomes))
            continue
        pending.pop(greedy, None)
        calibrations = blended(calibrations, {greedy: AcceptanceModel(priors).fit_counts(hits, outcomes)})
    return Stored(calibrations, pending, _blended_value(stored.draft_scale, draft_scale, _SCALE_BOUNDS), record,
                  _blended_value(stored.draft_overhead, draft_overhead, _OVERHEAD_BOUNDS))


def _blended_value(old: float | None, new: float | None, bounds: tuple[float, float]) -> float | None:
    """A stored value with a run's ``new`` one blended in (``_toward``), within ``bounds``; ``old`` without."""
    if new is None or not math.isfinite(new):
        return old
    lo, hi = bounds
    return min(max(_toward(old, new), lo), hi)


def pending_of(learned: Mapping[bool, object],
               counts: Mapping[bool, tuple[Counts, Sequence[float]]]) -> dict[bool, tuple[Counts, Sequence[float]]]:
    """Of a run's per-policy (counts, priors), those that go to pending: the policies that passed on no
    calibration (not in ``learned``) and saw outcomes (SpeculativeDecoder._remember, the simulation)."""
    return {greedy: entry for greedy, entry in counts.items() if greedy not in learned and sum(entry[0][1]) > 0}


def tested_of(models: Mapping[bool, AcceptanceModel],
              counts: Mapping[bool, tuple[Counts, Sequence[float]]]) -> dict[bool, float]:
    """Per policy whose ``models`` entry started from a stored calibration and whose run's per-slot ``counts``
    hold at least ``MIN_RECORD_OUTCOMES``: how much better that calibration predicted them than the priors as
    given (a log-likelihood ratio: ``passed_on``'s ``tested``)."""
    tested = {}
    for greedy, ((hits, outcomes), _) in counts.items():
        model = models.get(greedy)
        evidence = model.evidence_of(hits, outcomes) if model is not None else None
        if evidence is not None and sum(outcomes) >= MIN_RECORD_OUTCOMES:
            tested[greedy] = evidence
    return tested


def remember(key: str | None, learned: Mapping[bool, Sequence[float]],
             short: Mapping[bool, tuple[Counts, Sequence[float]]] | None = None,
             draft_scale: float | None = None, tested: Mapping[bool, float] | None = None,
             draft_overhead: float | None = None) -> None:
    """Pass a run's ``learned`` calibrations, ``short`` outcomes, ``draft_scale``, ``tested`` verdicts and
    ``draft_overhead`` on to the store (see passed_on) and write it (profile.write_cache_file), one run at a time
    (a lock file beside it)."""
    if key is None or not (learned or short or draft_scale is not None or tested or draft_overhead is not None):
        return
    path = _path_for(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Runs sharing the cache (a server's requests, batch jobs side by side) each read, blend and
        # write: unlocked, two that overlap both blend into the same old file and one blend is lost.
        with FileLock(path.with_suffix(".lock"), timeout=LOCK_SECONDS):
            stored = passed_on(recall_all(key), learned, short, draft_scale, tested, draft_overhead)
            data: dict[str, object] = {"format": FORMAT, "key": key}
            data.update({name: list(stored.calibrations[greedy]) for greedy, name in _POLICIES
                         if greedy in stored.calibrations})
            if stored.pending:
                data["pending"] = {name: {"hits": stored.pending[greedy][0], "outcomes": stored.pending[greedy][1]}
                                   for greedy, name in _POLICIES if greedy in stored.pending}
            if stored.draft_scale is not None:
                data["draft_scale"] = stored.draft_scale
            if stored.record:
                data["record"] = {name: list(stored.record[greedy]) for greedy, name in _POLICIES
                                  if greedy in stored.record}
            if stored.draft_overhead is not None:
                data["draft_overhead"] = stored.draft_overhead
            write_cache_file(path, data)
    except (OSError, Timeout):
        return  # a cache that can't be written (or is held that long) is skipped: it is an optimisation
