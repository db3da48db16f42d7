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
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

from filelock import FileLock, Timeout

from .engine import DrafterEngine, SpeculativeEngine, TextModel
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
# Seconds a run waits for another one's read-blend-write of the same calibration before it skips its own.
LOCK_SECONDS = 2.0

Calibration = tuple[float, float, float, float]


def pair_key(target: SpeculativeEngine, drafter: DrafterEngine) -> str | None:
    """The cache key of ``drafter`` against ``target``; None when either can't name itself (an
    engine that is not a ``TextModel``) or the drafter has no buckets to calibrate."""
    draft = drafter.cost_engine
    if not isinstance(target, TextModel) or (draft is not None and not isinstance(draft, TextModel)):
        return None
    buckets = [len(drafter.acceptance_priors(greedy)) for greedy in (True, False)]
    if not all(buckets):
        return None
    return json.dumps({"target": target.profile_key, "drafter": drafter.name, "buckets": buckets,
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


def recall(key: str | None) -> dict[bool, Calibration]:
    """The stored calibrations for greedy (True) and sampled (False) decoding under ``key``; those
    missing, unreadable, stored for another key or out of bounds are left out."""
    if key is None:
        return {}
    try:
        data = json.loads(_path_for(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
        return {}
    found = {greedy: _valid(data.get(name)) for greedy, name in ((True, "greedy"), (False, "sampled"))}
    return {greedy: cal for greedy, cal in found.items() if cal is not None}


def blend(old: Sequence[float] | None, new: Sequence[float]) -> Calibration | None:
    """``old`` moved ``BLEND`` of the way to ``new`` (``new`` itself when there is no ``old``), within
    bounds; None if the result is no calibration (not finite)."""
    fresh = tuple(float(v) for v in new)
    moved = fresh if old is None else tuple(o + BLEND * (n - o) for o, n in zip(old, fresh))
    return _valid([min(max(v, lo), hi) for v, (lo, hi) in zip(moved, _BOUNDS)])


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


def remember(key: str | None, learned: Mapping[bool, Sequence[float]]) -> None:
    """Move the stored calibrations ``BLEND`` of the way to ``learned`` (stored as is when there is
    none yet) and write them (profile.write_cache_file), one run at a time (a lock file beside them)."""
    if key is None or not learned:
        return
    path = _path_for(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Runs sharing the cache (a server's requests, batch jobs side by side) each read, blend and
        # write: unlocked, two that overlap both blend into the same old file and one blend is lost.
        with FileLock(path.with_suffix(".lock"), timeout=LOCK_SECONDS):
            stored = blended(recall(key), learned)
            write_cache_file(path, {"format": FORMAT, "key": key, **{
                name: list(stored[greedy]) for greedy, name in ((True, "greedy"), (False, "sampled"))
                if greedy in stored}})
    except (OSError, Timeout):
        return  # a cache that can't be written (or is held that long) is skipped: it is an optimisation
