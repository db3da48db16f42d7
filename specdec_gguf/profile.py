"""Cost profiles: measured seconds of one engine pass over n tokens, cached per engine identity.

On CPUs a pass over n tokens can cost nearly n one-token passes, so a draft token is
only worth verifying if it is likely enough to be accepted. A profile tells the
adaptive schedule what each extra verified token costs before the first round runs.
Profiles are cached in the user cache directory, keyed by what decides speed (model
file, threads, batch settings, llama.cpp build, device: ``TextModel.profile_key``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from .engine import SpeculativeEngine, is_text_model
from .errors import ConfigError

if TYPE_CHECKING:
    from .attention import AttentionChoice

# Pass sizes measured at load: n = k + 1 for k = 0, 1, 2, 4, 8 draft tokens; larger sizes
# are extrapolated, then measured online when the schedule uses them.
CALIBRATION_SIZES = (1, 2, 3, 5, 9)
CONTEXT_TOKENS = 16  # passes are timed after a short context, like an early round
# ... and, where it fits the budget, again after a long one: on small models attention over the
# context is a large share of a pass, and it grows with the pass size (a tiny F32 model: a 9-token
# pass costs 3.3 one-token passes after 16 tokens, 4.6 after 128), so a first bet priced at 16 loses.
LONG_CONTEXT_TOKENS = 128
FORMAT = 4  # bump when the file layout changes (2: the one-token cost reuses llama.cpp's graph; 3: long_seconds;
# 4: prefill_seconds, which a draft's catch-up is priced from: a cached profile without it would price one as before)
CALIBRATION_BUDGET = 0.5  # seconds: a repeat round is skipped if it would end past this (slow machines)
# Rounds a cached profile's timings should be the fastest of. One round can catch a busy moment (a
# 9-token pass timed at 4.9 one-token passes instead of 3.3 held Gemma's adaptive lookup at 2-token
# passes: 1.88x plain instead of 2.6x); a profile measured in fewer (the budget) gets a round more
# from each later run until it has them.
FULL_ROUNDS = 2
_NOISE = 100e-6  # seconds: how far apart two timings of the same tiny pass can be on a quiet machine
# A run whose steady plain steps take at most this share of its profile's one-token pass says the
# profile was timed in a busy moment (see distrust) ...
BUSY_PROFILE = 0.9
# ... and asks for a round more, at most this many times per cached profile: a machine whose plain steps
# beat even the fastest one-token pass measure() times would otherwise have every run time a round.
MAX_RECHECKS = 2


@dataclass
class CostProfile:
    """Seconds of one pass over n tokens, for measured n; other n are interpolated.

    ``cost(n)`` interpolates linearly between measured sizes and extrapolates past the
    largest with the slope of the last two (never below the largest measured cost).
    llama.cpp reuses its compute graph when a pass has the same size as the one before and
    rebuilds it otherwise, so ``seconds[1]`` is a one-token pass after another (a plain
    step in a run of plain steps), larger sizes are passes after a different size (a verify
    pass between plain steps), and ``switch_seconds`` is what a one-token pass pays after a
    pass of another size (the plain step after a verify pass).

    ``long_seconds``: the one-token pass and the largest size timed again after ``long_context``
    tokens of context (empty: not measured, the costs don't depend on the context).
    ``at_context(tokens)`` gives the curve after that many tokens: each pass size costs more by a
    slope per context token, measured for these sizes and linear in n between them (attention
    cost grows with both).
    """

    seconds: dict[int, float]
    switch_seconds: float = 0.0
    # The CONTEXT_TOKENS-token pass that takes in the context before the timings, asking for no logits (0: not
    # timed): a draft model's catch-up asks for the last position's only (``catch_up_cost``).
    prefill_seconds: float = 0.0
    long_context: int = 0
    long_seconds: dict[int, float] = field(default_factory=dict)
    rounds: int = FULL_ROUNDS  # timing rounds whose fastest each entry is (see profile_for)
    rechecks: int = 0  # times a run found it timed in a busy moment and asked for a round more (distrust)
    # The process whose rounds it holds (0: rounds of two or more processes): profile_for has a second process
    # time its largest size again.
    timed_by: int = field(default_factory=lambda: os.getpid())
    key: str = ""
    measured_at: float = field(default_factory=time.time)
    calibration_seconds: float = 0.0  # how long measuring took (0 when read from the cache)
    from_cache: bool = False

    def __post_init__(self) -> None:
        if not self.seconds or 1 not in self.seconds:
            raise ConfigError(f"a cost profile needs the one-token cost; got sizes {sorted(self.seconds)}")
        if any(not (isinstance(n, int) and n >= 1 and s > 0) for n, s in self.seconds.items()):
            raise ConfigError(f"cost profile entries must be n >= 1 -> seconds > 0; got {self.seconds}")
        if not self.switch_seconds >= 0:
            raise ConfigError(f"switch_seconds={self.switch_seconds!r} must be >= 0")
        if not (self.prefill_seconds >= 0 and math.isfinite(self.prefill_seconds)):
            raise ConfigError(f"prefill_seconds={self.prefill_seconds!r} must be a finite number >= 0")
        if self.long_seconds and not (set(self.long_seconds) <= set(self.seconds) and 1 in self.long_seconds
                                      and len(self.long_seconds) >= 2 and self.long_context > CONTEXT_TOKENS
                                      and all(s > 0 for s in self.long_seconds.values())):
            raise ConfigError(f"long_seconds={self.long_seconds} must time n = 1 and a larger measured size, > 0 s, "
                              f"after long_context={self.long_context} > {CONTEXT_TOKENS} tokens")
        self._sizes = sorted(self.seconds)
        # (context_slope's two ends, read per drafted proposal: the smallest and largest size timed long)
        if self.long_seconds:
            span = self.long_context - CONTEXT_TOKENS
            ends = (min(self.long_seconds), max(self.long_seconds))
            self._slopes = tuple((n, max(self.long_seconds[n] - self.seconds[n], 0.0) / span) for n in ends)

    def cost(self, n: int) -> float:
        """Seconds of a pass over ``n`` tokens (n >= 1)."""
        known, sizes = self.seconds, self._sizes
        if n in known:
            return known[n]
        if n < sizes[0]:
            return known[sizes[0]]
        if n > sizes[-1]:
            if len(sizes) == 1:
                return known[sizes[0]] * n / sizes[0]  # no slope known: assume linear (the safe side)
            lo, hi = sizes[-2], sizes[-1]
            slope = max((known[hi] - known[lo]) / (hi - lo), 0.0)
            return known[hi] + slope * (n - hi)
        for lo, hi in zip(sizes, sizes[1:]):
            if lo < n < hi:
                return known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
        raise AssertionError("unreachable")

    def catch_up_cost(self, n: int) -> float:
        """Seconds of a pass over ``n`` tokens that asks for the last position's logits only (a draft model's
        first pass of a proposal, which takes in what was committed since the last): T(2) and then the
        context prefill's cost per token, never above ``cost(n)``, the verify passes' (they compute every
        position's logits: after a pause a 129-token catch-up was priced 3.1x its cost on Gemma 3 270M, 3.4x
        on a tiny F32 draft; this, 1.15x and 1.95x). ``cost(n)`` where the prefill was not timed."""
        if n <= 2 or self.prefill_seconds <= 0:
            return self.cost(n)
        return min(self.cost(n), self.cost(2) + (n - 2) * self.prefill_seconds / CONTEXT_TOKENS)

    @property
    def plausible(self) -> bool:
        """Whether the curve looks measured on a quiet machine: a pass over more tokens costs no
        less (within 10% + 100 µs: timer noise) and at most twice as much per token as a smaller one.
        A profile measured while something else ran (a compile, a test suite) is not, and
        caching it would mislead every later run with these settings. (At most 1.5x per token, Gemma 3
        270M Q8_0 at one thread failed it on a quiet machine: its 2-token pass costs 3.1 one-token
        passes, another kernel; every run measured 4 rounds, 1.45 s, and cached nothing, while a run
        whose one-token passes were slow, 20 ms instead of 16, passed in one round and was cached.)"""
        sizes = self._sizes
        return all(0.9 * self.seconds[lo] - _NOISE <= self.seconds[hi] <= 2.0 * self.seconds[lo] * hi / lo + _NOISE
                   for lo, hi in zip(sizes, sizes[1:]))

    def context_slope(self, n: int) -> float:
        """Seconds a pass over ``n`` tokens costs more per token of context past ``CONTEXT_TOKENS``
        (0 where the long context wasn't measured; never negative: more context never costs less)."""
        if not self.long_seconds:
            return 0.0
        (lo, g_lo), (hi, g_hi) = self._slopes
        return max(g_lo + (g_hi - g_lo) * (n - lo) / (hi - lo), 0.0)

    def vouches_at(self, tokens: int) -> bool:
        """Whether the curve was measured at a context of ``tokens`` or longer, or found not to depend
        on the context (no long-context timing: weights, not attention, decide the costs)."""
        return not self.long_seconds or tokens <= self.long_context

    def at_context(self, tokens: int) -> CostProfile:
        """The curve for passes after ``tokens`` tokens of context (itself where nothing depends on it).

        Linear in the context between the two contexts measured, and the long one's beyond it: how
        costs grow further is learned online, from passes of the sizes the schedule verifies. Priced
        as growing on (a 9-token pass after 380 tokens: 3.8 one-token passes on the wide tiny model,
        measured 3.5), a draft whose probabilities undersell it was never verified, so never showed
        that it pays (1.35x -> 1.0x plain on that model's long prompts)."""
        extra = min(tokens, self.long_context) - CONTEXT_TOKENS
        if not self.long_seconds or extra <= 0:
            return self
        return CostProfile({n: s + self.context_slope(n) * extra for n, s in self.seconds.items()},
                           switch_seconds=self.switch_seconds, key=self.key, measured_at=self.measured_at,
                           prefill_seconds=self.prefill_seconds)

    def combined(self, other: CostProfile) -> CostProfile:
        """This profile and ``other`` (measured again, perhaps of other sizes: ``measure``'s budget) as one:
        the fastest of each size either timed."""
        # (The one-token pass after another size: each profile's T(1) plus its switch.)
        after = min(self.seconds[1] + self.switch_seconds, other.seconds[1] + other.switch_seconds)
        seconds = {n: min(self.seconds.get(n, math.inf), other.seconds.get(n, math.inf))
                   for n in set(self.seconds) | set(other.seconds)}
        context, long = (self.long_context, self.long_seconds) if self.long_seconds else \
            (other.long_context, other.long_seconds)
        if self.long_seconds and other.long_seconds and self.long_context == other.long_context:
            long = {n: min(self.long_seconds[n], other.long_seconds[n]) for n in self.long_seconds
                    if n in other.long_seconds}
        prefills = [p for p in (self.prefill_seconds, other.prefill_seconds) if p > 0]
        return CostProfile(seconds, switch_seconds=max(after - seconds[1], 0.0), key=self.key,
                           prefill_seconds=min(prefills, default=0.0),
                           long_context=context, long_seconds=dict(long), rounds=self.rounds + other.rounds,
                           rechecks=max(self.rechecks, other.rechecks),
                           timed_by=self.timed_by if self.timed_by == other.timed_by else 0)

    def ratios(self) -> dict[int, float]:
        """cost(n) / cost(1) for the measured sizes."""
        return {n: self.seconds[n] / self.seconds[1] for n in self._sizes}

    def as_dict(self) -> dict:
        return {"format": FORMAT, "key": self.key, "measured_at": self.measured_at, "rounds": self.rounds,
                "rechecks": self.rechecks, "timed_by": self.timed_by,
                "calibration_seconds": self.calibration_seconds, "switch_seconds": self.switch_seconds,
                "prefill_seconds": self.prefill_seconds,
                "seconds": {str(n): s for n, s in sorted(self.seconds.items())},
                "long_context": self.long_context,
                "long_seconds": {str(n): s for n, s in sorted(self.long_seconds.items())}}

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        return cls(seconds={int(n): float(s) for n, s in data["seconds"].items()},
                   switch_seconds=float(data["switch_seconds"]), key=str(data.get("key", "")),
                   prefill_seconds=float(data.get("prefill_seconds", 0.0)),
                   long_context=int(data.get("long_context", 0)),
                   long_seconds={int(n): float(s) for n, s in data.get("long_seconds", {}).items()},
                   rounds=int(data.get("rounds", 1)),  # (not said: perhaps one, so a round more)
                   rechecks=int(data.get("rechecks", 0)),
                   timed_by=int(data.get("timed_by", -1)),  # (not said: an older version's, confirmed once)
                   measured_at=float(data.get("measured_at", 0.0)), from_cache=True)


def measure(engine: SpeculativeEngine, sizes: Sequence[int] = CALIBRATION_SIZES, repeats: int = 2,
            token: int = 0, budget: float = CALIBRATION_BUDGET, *, within_budget: bool = False,
            known: CostProfile | None = None) -> CostProfile:
    """Time one pass of each size in ``sizes`` on ``engine`` (the fastest of ``repeats`` rounds, up
    to two more while the curve is not ``plausible``). A repeat round of a plausible curve is
    skipped when it would end more than ``budget`` seconds after the start: on a slow machine
    (Gemma 3 270M at one thread on a 2-core Xeon: 0.39 s a round) one round serves this run and
    ``profile_for`` adds the second in the next (``rounds`` says how many there were).

    ``within_budget`` (a run's own calibration, not `specdec calibrate`'s): where even the first round
    would end past ``budget`` (Gemma 3 270M at one thread on an Intel Xeon model 167: 0.52-0.59 s, a
    one-token pass 42-50 ms), it leaves out the sizes it can (``_can_leave_out``: those ``known``
    already has, and the ones between the smallest verify pass and the second largest) as its estimate of
    the round says; the profile interpolates them, and ``profile_for``'s next run times those it lacks.

    Uses and then clears the engine's cache. Each round runs the sizes largest first (the
    first sizes the output buffers), so every pass follows one of another size and rebuilds
    llama.cpp's graph, as a verify pass does; then one more one-token pass, which reuses the
    graph of the one before, as a plain step does: the two one-token timings give
    ``switch_seconds``. Each size's first pass also builds its graph for the first time: the
    fastest-of rule leaves that out, so no separate warm-up pass is spent. The schedule
    refines every size online. The pass that takes the context in, asking for no logits, is timed
    too (``prefill_seconds``: what a draft's catch-up is priced from, ``CostProfile.catch_up_cost``).
    """
    sizes = sorted(set(sizes) | {1})
    if sizes[-1] + CONTEXT_TOKENS > engine.n_ctx:
        sizes = [n for n in sizes if n + CONTEXT_TOKENS <= engine.n_ctx] or [1]
    start = time.perf_counter()
    base = min(CONTEXT_TOKENS, engine.n_ctx - sizes[-1])
    order = [*reversed(sizes), 0]  # 0: the one-token pass right after a one-token pass

    engine.reset(0)
    try:
        prefill_start = time.perf_counter()
        engine.advance([token] * base)
        prefill = time.perf_counter() - prefill_start  # (the first pass after a load: warm-up errs on the dear side)
        best = {n: math.inf for n in order}
        rounds = 0
        while True:
            began = time.perf_counter()
            rounds += 1
            for i, n in enumerate(order):
                if within_budget and rounds == 1 and _can_leave_out(n, sizes, known) and \
                        time.perf_counter() - start + _round_left(order[i:], sizes, best, known) > budget:
                    continue  # (not timed: estimated in this round's remaining passes no more)
                best[n] = min(best[n], _timed(engine, n or 1, token, base))
            if not _profile(best).plausible:
                if rounds < repeats + 2:
                    continue  # more rounds (two at most) while the curve is implausible: a busy moment passes
                break
            now = time.perf_counter()
            if rounds >= max(repeats, 1) or now - start + (now - began) > budget:
                break
        # (A long-context timing below the short one, a busy moment in the short round, gives no slope.)
        long = _long_context(engine, _profile(best), sizes[-1], repeats, token, budget - (time.perf_counter() - start))
        profile = _profile(best, long)
        profile.rounds = rounds
        profile.prefill_seconds = prefill if base == CONTEXT_TOKENS else 0.0
    finally:
        engine.reset(0)
    profile.calibration_seconds = time.perf_counter() - start
    return profile


def _can_leave_out(n: int, sizes: Sequence[int], known: CostProfile | None) -> bool:
    """Whether a round kept within the budget may leave size ``n`` untimed (``measure``): given what an earlier
    run ``known`` timed, a size it has (the ones it lacks are this run's to time); else one between the
    smallest verify pass and the second largest size (the two largest give the estimates, the one-token
    passes T(1) and the switch, the smallest verify pass the price of the draft tokens bet most). Never the
    one-token passes (0: the one after another)."""
    if n <= 1:
        return False
    if known is not None:
        return n in known.seconds
    return len(sizes) > 3 and sizes[1] < n < sizes[-2]


def _round_left(left: Sequence[int], sizes: Sequence[int], best: dict[int, float], known: CostProfile | None) -> float:
    """Estimated seconds of a round's passes still to time, ``left`` (the first, the one about to be timed or left
    out, and those after it that may not be left out), for ``measure``'s budget."""
    return sum(_estimate(m, best, known) for i, m in enumerate(left) if not i or not _can_leave_out(m, sizes, known))


def _estimate(n: int, best: dict[int, float], known: CostProfile | None) -> float:
    """Seconds a pass over ``n`` tokens (0: one token) is expected to take, for ``measure``'s budget: ``known``'s
    cost where given, else the line through the two smallest sizes timed so far (above a concave curve
    to their left: the safe side), else 0."""
    size = n or 1
    if known is not None:
        return known.cost(size)
    timed = sorted((m, t) for m, t in best.items() if m > 1 and t < math.inf)
    if len(timed) < 2:
        return timed[0][1] * size / timed[0][0] if timed else 0.0
    (lo, t_lo), (hi, t_hi) = timed[:2]
    return max(t_lo + (t_hi - t_lo) * (size - lo) / (hi - lo), 0.0)


def _long_context(engine: SpeculativeEngine, short: CostProfile, largest: int, repeats: int, token: int,
                  budget: float) -> dict[int, float]:
    """The one-token pass (after another) and the ``largest`` pass timed after ``LONG_CONTEXT_TOKENS``
    tokens, the fastest of ``repeats`` rounds; empty when that would not fit in ``budget`` seconds (a
    model whose passes are slow: its weights, not attention, decide its costs) or in the context."""
    base = LONG_CONTEXT_TOKENS
    if base + largest > engine.n_ctx or largest < 2:
        return {}
    # Taking in the context is one pass over it; the passes after it cost at most twice the short ones.
    estimate = short.cost(base) + repeats * 2 * (short.cost(largest) + 2 * short.cost(1))
    if estimate > budget:
        return {}
    engine.reset(0)
    engine.advance([token] * base)
    best = {n: math.inf for n in (largest, 1, 0)}
    for _ in range(max(repeats, 1)):
        for n in best:  # the largest, then a one-token pass after it, then one after that (reusing the graph)
            best[n] = min(best[n], _timed(engine, n or 1, token, base))
    return {largest: best[largest], 1: min(best[0], best[1])}


def _timed(engine: SpeculativeEngine, n: int, token: int, base: int) -> float:
    """Seconds of one pass over ``n`` tokens after ``base`` cached ones; the cache is left at ``base``."""
    t0 = time.perf_counter()
    engine.forward_argmax([token] * n)
    seconds = time.perf_counter() - t0
    engine.reset(base)
    return seconds


def _profile(best: dict[int, float], long: dict[int, float] | None = None) -> CostProfile:
    """A profile from ``measure``'s timings (key 0: the one-token pass after a one-token pass) and
    ``_long_context``'s."""
    reused = min(best[0], best[1])  # a reused graph is never dearer: a larger timing is noise
    return CostProfile(seconds={**{n: s for n, s in best.items() if n > 1 and s < math.inf}, 1: reused},
                       switch_seconds=best[1] - reused, long_context=LONG_CONTEXT_TOKENS if long else 0,
                       long_seconds=dict(long or {}))


def cache_dir() -> Path:
    """Where profiles are cached: $SPECDEC_CACHE_DIR, else the platform's user cache folder."""
    if os.environ.get("SPECDEC_CACHE_DIR"):
        return Path(os.environ["SPECDEC_CACHE_DIR"]) / "profiles"
    if sys.platform == "darwin":
        root = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        root = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "specdec-gguf" / "profiles"


def _path_for(key: str) -> Path:
    return cache_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def load_cached(key: str) -> CostProfile | None:
    """The cached profile for ``key``, or None (missing, unreadable or for another key)."""
    data = read_cache_file(_path_for(key), key, FORMAT)
    try:
        profile = CostProfile.from_dict(data) if data is not None else None
    except (ValueError, KeyError, TypeError, ConfigError):
        return None
    return profile if profile is not None and profile.plausible else None  # (implausible: an older version's, under load)


def read_cache_file(path: Path, key: str, fmt: int) -> dict | None:
    """The JSON object ``write_cache_file`` wrote to ``path`` for ``key`` in format ``fmt`` (None: missing,
    unreadable, or another key's or format's)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == fmt and data.get("key") == key else None


def save(profile: CostProfile) -> None:
    """Write ``profile`` to the cache atomically; a cache that can't be written is skipped."""
    write_cache_file(_path_for(profile.key), profile.as_dict())


def write_cache_file(path: Path, data: dict) -> None:
    """Write ``data`` as JSON to ``path`` atomically (readers see the old file or the new one);
    a cache that can't be written is skipped: caching is an optimisation, never a result."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")  # (per writer: none sees another's)
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


def distrust(profile: CostProfile) -> bool:
    """A run's plain steps ran well under ``profile``'s one-token pass (``BUSY_PROFILE``): it was timed in
    a busy moment, which slows that (memory-bound) pass most, so its ratios understate every verify pass.
    The cached copy, if it is this measurement, asks the next run for a round more, whose fastest timings
    it keeps (profile_for), at most ``MAX_RECHECKS`` times. Whether the cache was changed."""
    cached = load_cached(profile.key) if profile.key else None
    if cached is None or cached.measured_at != profile.measured_at or cached.rounds < FULL_ROUNDS \
            or cached.rechecks >= MAX_RECHECKS:
        return False  # (not cached, another measurement since, already asking for a round, or asked enough)
    cached.rounds = FULL_ROUNDS - 1
    cached.rechecks += 1
    save(cached)
    return True


def with_timed_context(profile: CostProfile, attention: AttentionChoice | None) -> CostProfile:
    """``profile`` with the flash attention timing's passes as its long context, where that timing turned flash
    attention off and the profile has no long-context timing of its own (too slow a model for the calibration
    budget); else ``profile``.

    Such a profile takes the costs as the same at any context. Without flash attention they are not: llama.cpp
    attends over the cache in blocks of 256 cells, and past 256 tokens, where the timing's passes ran (over
    512), a one-token pass costs more. Priced from the profile alone, a run after a 350-token prompt on a
    12-layer Q8_0 model scaled every pass size by its dearer one-token pass (a 3-token verify pass priced at
    1.43 one-token passes cost 1.05) until the online fit had verify passes to go on. (A fast model's own timing
    after 128 tokens stays: priced from the timing's instead, the tiny F32 pair looked at its draft once an
    answer after long prompts, 0.986x -> 0.966x plain at 1 thread. With flash attention on the growth starts at
    once, and the profile's own timing sees it.)"""
    if attention is None or attention.flash_attn is not False or profile.long_seconds:
        return profile
    long = {n: s for n, s in attention.seconds.get("off", {}).items() if n in profile.seconds}
    if 1 not in long or len(long) < 2 or not all(s > 0 for s in long.values()):
        return profile
    return replace(profile, long_context=attention.context, long_seconds=long)


def profile_for(engine: SpeculativeEngine | None, *, use_cache: bool = True) -> CostProfile | None:
    """The engine's cost profile: cached if known, else measured now (and cached).

    None for engines that don't name their speed (not a ``TextModel``, e.g. InMemoryEngine):
    the schedule then learns costs online, assuming linear costs until it has measured. Priced past the
    short context with the engine's flash attention timing where that applies (``with_timed_context``);
    cached as measured.
    """
    if engine is None or not is_text_model(engine):
        return None
    key = engine.profile_key
    cached = load_cached(key) if use_cache else None
    # A profile whose rounds were all timed by one other process is timed again by this one: a busy moment can
    # last a whole calibration (the first run after installing timed Gemma's 9-token pass at 4.65 one-token
    # passes in both its rounds, 3.0-3.2 on a quiet host), and a size priced too dear is never verified, so
    # never timed again (the demo ran 2.1x plain on that cache run after run, 3.8x once it was timed again).
    complete = cached is not None and cached.rounds >= FULL_ROUNDS
    confirm = complete and cached.timed_by not in (0, os.getpid())
    if complete and not confirm:
        return with_timed_context(cached, engine.attention)
    # None cached, or one measured in fewer rounds (the budget): this run times a round (more where the budget
    # allows) and keeps the fastest of all. One to confirm: its largest size, which a run that prices it too
    # dear never verifies (the online fit keeps the profile's shape for sizes it doesn't verify), with the
    # one-token passes it is priced against: half a round (Gemma 3 270M at 2 threads: 0.14 s, once).
    if confirm:
        profile = measure(engine, sizes=(1, max(cached.seconds)), repeats=1, token=max(engine.bos_token, 0),
                          within_budget=True)
        if not profile.plausible:  # (a busy moment itself: this run keeps the cached one, the next times again)
            return with_timed_context(cached, engine.attention)
    else:
        profile = measure(engine, repeats=FULL_ROUNDS - cached.rounds if cached else FULL_ROUNDS,
                          token=max(engine.bos_token, 0), within_budget=True, known=cached)
    if cached is not None and profile.plausible:
        spent = profile.calibration_seconds
        profile = cached.combined(profile)
        profile.calibration_seconds = spent
    profile.key = key
    if use_cache and profile.plausible:  # an implausible one serves this run only; the next measures again
        save(profile)  # (as measured: the timing's passes join it as it is read)
    return with_timed_context(profile, engine.attention)
