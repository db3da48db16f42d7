"""Online cost fits: what a target pass and a draft proposal cost now, from a profile and recent rounds.

A :class:`~specdec_gguf.profile.CostProfile` is measured once, at a short context, on a
quiet machine; a run's passes cost what load, context length and the order of pass sizes
make them. These fits keep the profile's shape and learn its scale from the last rounds.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from collections import deque
from itertools import accumulate
from typing import Sequence

from .profile import CONTEXT_TOKENS, CostProfile

STEADY_STEPS = 8  # plain steps after plain steps that say what a one-token pass costs now
# A draft price's scale passed on to later runs (DraftPrice.take_scale): the proposals a run must have
# recorded (fewer say little), and how many readings the remembered scale counts as in the next run.
MIN_SCALE_READINGS = 2
REMEMBERED_WEIGHT = 2
MAX_READINGS = 4096  # ... and the most a decoder keeps between two pass-ons (the latest)
# A proposal's overhead (DraftPrice._fit_overhead) is fitted once the window's warm readings hold this many
# short ones and as many long ones, the long ones' shaped seconds at least OVERHEAD_SPREAD times the short ones'.
OVERHEAD_READINGS = 3
OVERHEAD_SPREAD = 1.5


class VerifyCosts:
    """T(n), the seconds of a target pass over n tokens (n = 1 .. ``sizes``), and the switch.

    ``T(n) = s·P(n) + e·(n − 1)``: ``s`` is how much slower a one-token pass runs now than when
    profiled (load, a longer context), ``e`` the extra cost per verified token the profile
    misses (on small models attention over a longer context grows with n; our own per-token
    work). Both are medians over the last ``window`` rounds. Without a profile P(n) = n: linear
    costs. T(1) is a plain step after a plain step; ``switch`` is what one costs more after a
    verify pass (llama.cpp rebuilds its compute graph when the pass size changes), fitted from
    plain steps after verify passes. The table is rebuilt after ``refresh_every`` rounds and
    ``refresh_seconds`` of them (both), or at once when a pass cost far from what it said.
    """

    def __init__(self, profile: CostProfile | None, sizes: int, *, window: int, refresh_every: int,
                 refresh_seconds: float, bound_by_passes: bool = False) -> None:
        self.profile = profile
        self.bound_by_passes = bound_by_passes
        self.refresh_every, self.refresh_seconds = refresh_every, refresh_seconds
        self._sizes = sizes
        # The profile's T(n), or n itself without one (then the fit makes it linear in T(1)).
        self._shape = [profile.cost(n) if profile is not None else float(n) for n in range(1, sizes + 1)]
        self._switch_shape = profile.switch_seconds if profile is not None else 0.0
        # (pass size, seconds, whether the pass before had another size: llama.cpp rebuilt its graph)
        self._recent: deque[tuple[int, float, bool]] = deque(maxlen=window)
        self._last_pass = 0  # size of the latest pass (0: none yet)
        self.table: list[float] = []  # T(1), T(2), ...: valid while not ``stale``
        self.switch = 0.0
        self.stale = True
        self._since_refresh = 0
        self._since_refresh_seconds = 0.0

    @property
    def after_plain(self) -> bool:
        """Whether the latest pass was a plain step (a verify pass now makes the next one pay the switch)."""
        return self._last_pass == 1

    @property
    def after_verify(self) -> bool:
        """Whether the latest pass was a verify pass (the next plain step pays the switch)."""
        return self._last_pass > 1

    def at_context(self, tokens: int) -> None:
        """Passes now follow ``tokens`` tokens of context (a generation starts): the profile's curve there
        is the shape from now on (``CostProfile.at_context``)."""
        if self.profile is not None:
            curve = self.profile.at_context(tokens)
            self._shape = [curve.cost(n) for n in range(1, self._sizes + 1)]
            self.stale = True

    def steady_seconds(self) -> float | None:
        """Median seconds of the plain steps after plain steps in the window, once there are
        ``STEADY_STEPS`` of them (None: fewer): what a one-token pass costs now."""
        steady = [t for n, t, switched in self._recent if n == 1 and not switched]
        return statistics.median(steady) if len(steady) >= STEADY_STEPS else None

    def rounds_to_refresh(self, round_seconds: float) -> int:
        """About how many rounds of ``round_seconds`` each may be recorded from now before the table is
        due to be rebuilt (both conditions: rounds and seconds), one fewer to be safe; 0 if it is due."""
        if self.stale or not self.table:
            return 0
        rounds = self.refresh_every - self._since_refresh
        if round_seconds > 0:
            rounds = max(rounds, math.ceil((self.refresh_seconds - self._since_refresh_seconds) / round_seconds))
        return max(rounds - 1, 0)

    def record(self, size: int, seconds: float, round_seconds: float) -> None:
        """A target pass over ``size`` tokens took ``seconds`` (its round ``round_seconds``)."""
        self._recent.append((size, seconds, size != self._last_pass))
        self._last_pass = size
        self._since_refresh += 1
        self._since_refresh_seconds += round_seconds
        if self.stale:
            return  # (the checks below only decide to make it stale)
        if not self.table or (self._since_refresh >= self.refresh_every
                              and self._since_refresh_seconds >= self.refresh_seconds):
            self.stale = True
        elif 1 < size <= len(self.table):
            predicted = self.table[size - 1]
            self.stale = abs(seconds - predicted) > 0.5 * predicted  # refit when far off
        if self.stale:
            self._since_refresh, self._since_refresh_seconds = 0, 0.0

    def record_plain_steps(self, seconds: Sequence[float], round_seconds: Sequence[float]) -> None:
        """``record(1, s, r)`` for each (s, r) of plain steps that follow a plain step (a pause's rounds,
        told together), without a loop in Python: the same state, the same sums in the same order."""
        if not seconds:
            return
        self._recent.extend((1, t, False) for t in seconds[-(self._recent.maxlen or len(seconds)):])
        self._last_pass = 1
        # The running sums the rounds one by one would leave: the first that makes the table due resets them.
        sums = list(accumulate(round_seconds, initial=self._since_refresh_seconds))
        due = len(seconds) + 1
        if not self.stale:
            due = 1 if not self.table else max(self.refresh_every - self._since_refresh,
                                               bisect_left(sums, self.refresh_seconds), 1)
        if due > len(seconds):
            self._since_refresh += len(seconds)
            self._since_refresh_seconds = sums[-1]
            return
        self.stale = True
        self._since_refresh, self._since_refresh_seconds = len(seconds) - due, sum(round_seconds[due:], 0.0)

    def refit(self) -> list[float]:
        """Rebuild ``table`` and ``switch`` from the recent passes (empty: nothing known yet)."""
        self.stale = False
        shape, recent = self._shape, self._recent
        steady = [t / shape[0] for n, t, switched in recent if n == 1 and not switched]
        # Plain steps that each follow a verify pass: all there is to go on (they include the switch).
        ones = steady if len(steady) >= 3 else [t / shape[0] for n, t, _ in recent if n == 1]
        if len(ones) >= 3 or (ones and self.profile is None):
            scale = statistics.median(ones)
        elif recent:
            scale = statistics.median(t / shape[n - 1] for n, t, _ in recent)
        elif self.profile is not None:
            scale = 1.0
        else:
            self.table = []  # nothing known: the first round is a plain step that measures T(1)
            return self.table
        extra = [(t - scale * shape[n - 1]) / (n - 1) for n, t, _ in recent if n > 1]
        per_token = statistics.median(extra) if len(extra) >= 3 else 0.0
        after = [t - scale * shape[0] for n, t, switched in recent if n == 1 and switched]
        self.switch = max(statistics.median(after), 0.0) if len(after) >= 3 and ones is steady \
            else scale * self._switch_shape
        table, floor = [], 0.0
        for i, p in enumerate(shape):
            floor = max(floor, scale * p + per_token * i, 1e-9)  # a longer pass never costs less
            table.append(floor)
        if self.bound_by_passes:
            self._bound_by_passes(table)
        self.table = table
        return table

    def _bound_by_passes(self, table: list[float]) -> None:
        """Lower ``table`` where this run's passes say the profile priced a size too dear: a pass over n tokens costs
        at most what ceil(n / m) passes over m tokens do, for each size m timed in the window (its median). A size
        priced too dear is never verified, so never timed: a profile timed in a busy moment (the first run after
        installing: 5- and 9-token passes at 1.6x) kept the demo at 2-token passes, 2.1x plain against 3.8x. A size
        the window timed keeps its own fit; the table stays nondecreasing."""
        by_size: dict[int, list[float]] = {}
        for n, t, _ in self._recent:
            if n > 1:
                by_size.setdefault(n, []).append(t)
        for m, times in by_size.items():
            tm = statistics.median(times)
            for n in range(m + 1, len(table) + 1):
                if n not in by_size:  # (a size the window timed is fitted from its own passes)
                    table[n - 1] = min(table[n - 1], -(-n // m) * tm)
        for i in range(1, len(table)):
            table[i] = max(table[i], table[i - 1])  # (a longer pass never costs less: nor than a timed one)


class DraftPrice:
    """What a draft model's proposal of k tokens costs at the current context: ``start + k·per_token`` seconds.

    Its first pass also takes in the tokens committed since the last proposal (a longer
    pass, after one of another size), then one pass per token. The draft's profile gives
    the shape (``start`` = T(2) + switch − T(1), ``per_token`` = T(1), each pass dearer by the
    profile's context slope for the context it attends to), the last ``window`` proposals the
    scale: the median of measured / shaped, each shaped at its own context and first pass. Without
    a profile: no start, and ``per_token`` the median measured price per drafted token (None until
    one is measured). Priced by the average per drafted token, short proposals' first passes made
    every further token look 1.7-2.5x dearer than it is; shaped without the context and the catch-up,
    the scale took in a long prompt's dearer passes and a look's catch-up (tiny-wide after a 380-token
    prompt: 1.4x-1.8x), and the price of the next look counted the context a second time.

    With ``overhead``, ``start`` also holds what each proposal costs beyond its shaped passes, fitted apart from
    the scale (``_fit_overhead``): the drafter's own work per proposal, and a first pass after a target pass
    that evicted the draft's weights. One scale for both, set by a window of long proposals, priced each
    further token at their average (tiny-wide at 1 thread: 1.02 ms against 0.81 measured, a proposal's start
    0.26 ms against 1.35).
    """

    def __init__(self, profile: CostProfile | None, *, window: int, max_catch_up: int | None,
                 remembered: float | None = None, last_logits: bool = True, overhead: bool = False,
                 remembered_overhead: float | None = None) -> None:
        self.profile = profile
        self.max_catch_up = max_catch_up  # the drafter's (DrafterEngine.max_catch_up)
        # A proposal's first pass asks for the last position's logits: priced so (CostProfile.catch_up_cost),
        # not as a verify pass over as many tokens (False: as one).
        self.last_logits = last_logits
        # Readings (shaped seconds, measured seconds, the most a cold one may say), or (None, value, inf): a value
        # taken as it is (a remembered scale; without a profile, a price per token). The scale is the median
        # ratio of measured to shaped, the overhead taken off.
        self._window: deque[tuple[float | None, float, float]] = deque(maxlen=window)
        self._scale = 1.0
        # Seconds each proposal costs beyond its shaped passes (_fit_overhead; 0 with ``overhead`` off).
        self.fits_overhead = overhead and profile is not None
        self.overhead = 0.0
        if self.fits_overhead and remembered_overhead is not None:
            self.overhead = remembered_overhead * profile.cost(1)  # type: ignore[union-attr]  (checked above)
        self._fitted: float | None = None  # this run's own fit of it, in the profile's one-token passes
        # This run's readings (shaped, measured, cold), not yet passed on (take_scale); bounded for a decoder
        # that never passes them on (no calibration store), whose every proposal would otherwise stay here.
        self._readings: deque[tuple[float, float, bool]] = deque(maxlen=MAX_READINGS)
        if profile is not None and remembered is not None:
            # What earlier runs of this pair measured (calibrations.py) stands for REMEMBERED_WEIGHT readings:
            # a run that drafts rarely is priced as it runs, not as the profile was timed (see take_scale).
            self._window.extend([(None, remembered, math.inf)] * REMEMBERED_WEIGHT)
            self._scale = remembered
        self.start = 0.0
        self.per_token: float | None = None
        if profile is not None:
            self.at_context(0)

    def at_context(self, context: int) -> None:
        """Price proposals drafted after ``context`` committed tokens (``start`` and ``per_token``)."""
        if self.profile is None:
            return
        self._price(context, self._pass(1, context))

    def _price(self, context: int, one: float) -> None:
        """``at_context`` with the profile's one-token pass at ``context`` (``one``) already known."""
        profile: CostProfile = self.profile  # type: ignore[assignment]  (only called with one)
        self.start = self._scale * max(self._pass(2, context) + profile.switch_seconds - one, 0.0) + self.overhead
        self.per_token = self._scale * one

    def record(self, drafted: int, seconds: float, *, cold: bool = False, context: int = 0, untaken: int = 0) -> None:
        """A proposal of ``drafted`` tokens after ``context`` committed tokens took ``seconds`` to draft,
        its first pass taking in the ``untaken`` tokens committed since the last proposal too (as
        ``catch_up`` prices them). ``cold``: one of a generation's first proposals, its caches cold from the
        prefills: it may say the draft is cheaper than priced now, never dearer (a 1-token draft then costs
        up to 2-3x its later price, and alone in the window that priced drafting out of every later round of
        the run, looks too: ScheduleConstants.cold_proposals). Without a profile it counts as any other
        (nothing else gives a price). The prices follow to ``context``."""
        if self.profile is None:
            self._window.append((None, seconds / drafted, math.inf))
            self.per_token = statistics.median(self._ratio(reading) for reading in self._window)
            return
        tokens, before = self._fed(untaken, context)
        one = self._pass(1, context)
        # (After a drafted round the first pass takes the anchor and the target's token after the kept ones.)
        shaped = self._pass(max(tokens + 1, 2), before, first=True) + self.profile.switch_seconds + (drafted - 1) * one
        self._readings.append((shaped, seconds, cold))
        self._window.append((shaped, seconds, self._scale if cold else math.inf))
        if self.fits_overhead and not cold:
            self._fit_overhead()
        self._scale = statistics.median(self._ratio(reading) for reading in self._window)
        self._price(context, one)

    def _ratio(self, reading: tuple[float | None, float, float]) -> float:
        """A window reading's measured / shaped seconds, the overhead taken off (a remembered one: its scale)."""
        shaped, measured, most = reading
        if shaped is None:
            return measured
        return min(max(measured - self.overhead, 0.0) / shaped, most)

    def _fit_overhead(self) -> None:
        """The overhead, where the window's warm readings say it: a resistant line through them, seconds =
        scale·shaped + overhead, from the medians of the short and the long ones (shaped below and above
        the middle of their range; OVERHEAD_READINGS of each, the long ones' median shaped at least
        OVERHEAD_SPREAD times the short ones': proposals alike in length can't tell an overhead from a scale).
        Else the overhead stays as remembered or last fitted."""
        warm = [(shaped, measured) for shaped, measured, most in self._window
                if shaped is not None and most == math.inf]
        if len(warm) < 2 * OVERHEAD_READINGS:
            return
        middle = 0.5 * (min(x for x, _ in warm) + max(x for x, _ in warm))
        low = [(x, y) for x, y in warm if x < middle]
        high = [(x, y) for x, y in warm if x >= middle]
        if len(low) < OVERHEAD_READINGS or len(high) < OVERHEAD_READINGS:
            return
        x_low, x_high = statistics.median(x for x, _ in low), statistics.median(x for x, _ in high)
        if x_high < OVERHEAD_SPREAD * x_low:
            return
        slope = (statistics.median(y for _, y in high) - statistics.median(y for _, y in low)) / (x_high - x_low)
        if slope <= 0.0:
            return  # (noise: nothing to say)
        overhead = statistics.median(y - slope * x for x, y in warm)
        self.overhead = min(max(overhead, 0.0), min(y for _, y in warm))  # never above the cheapest proposal
        self._fitted = self.overhead / self.profile.cost(1)  # type: ignore[union-attr]  (only fitted with one)

    def take_overhead(self) -> float | None:
        """The overhead this run fitted (in the profile's one-token passes), for the next runs of the pair to
        start from; None where its readings never said (then and after a call: None until they say again)."""
        fitted, self._fitted = self._fitted, None
        return fitted

    def take_scale(self) -> float | None:
        """The median measured / shaped ratio (the overhead taken off) of the proposals recorded since the last
        call, for the next runs of the pair to start from: of those after each generation's cold ones where there are
        ``MIN_SCALE_READINGS`` of them (a pair that drafts on: its first proposals read 2-3x, its later ones
        1.1-1.6x on tiny-wide), else of them all, unclipped (a pair that drafts a few times an answer pays
        the cold price each time); None with fewer.

        The profile times the draft's passes back to back; in a run they follow target passes that evict
        the draft's weights from the CPU caches, and the drafter's own work per token adds to each. A tiny
        F32 draft's one-token pass, 0.11 ms in the profile, took 0.16 ms after one target pass and 0.27 ms
        after a hundred (1 thread, model 167); a proposal of one token after plain steps read 2x its price.
        A fresh decoder (``specdec run``) starts at the profile's price, and its first proposals may only
        lower it (``record``'s ``cold``): one that drafted a few times in an answer never learned it, and its
        drafting at 0.4x the real price cost 3-6% of a 256-token answer."""
        readings, self._readings = self._readings, deque(maxlen=MAX_READINGS)
        ratios = [(self._ratio((shaped, measured, math.inf)), cold) for shaped, measured, cold in readings]
        warm = [ratio for ratio, cold in ratios if not cold]
        chosen = warm if len(warm) >= MIN_SCALE_READINGS else [ratio for ratio, _ in ratios]
        if len(chosen) < MIN_SCALE_READINGS:
            return None
        # Never below 1: between target passes a draft runs no faster than timed back to back, so a lower
        # ratio says the shape is off, not the draft cheaper. (A catch-up is shaped from verify passes, which
        # compute every position's logits where it asks for the last: Gemma 3 270M's 129-token catch-up after
        # 100 tokens took 235 ms, shaped 669 at 2 threads; remembered, such looks would price a rarely drafting
        # pair's draft at a third of its cost in the next run.) Within a run the readings may still lower it.
        return max(statistics.median(chosen), 1.0)

    def _fed(self, untaken: int, context: int) -> tuple[int, int]:
        """The committed tokens a proposal's first pass takes in besides the anchor, and the context before
        them in the draft's cache."""
        if self.max_catch_up is not None and untaken > self.max_catch_up:
            return self.max_catch_up, 0  # the drafter restarts its view on the latest tokens
        return untaken, max(context - untaken, 0)

    def _pass(self, n: int, before: int, *, first: bool = False) -> float:
        """The profile's seconds for a pass over ``n`` tokens after ``before`` tokens of context (the
        context's share extrapolated past the longest context measured). ``first``: a proposal's first pass
        (the committed tokens it takes in, the anchor), which asks for the last position's logits only
        (``last_logits``: priced by ``CostProfile.catch_up_cost``)."""
        profile: CostProfile = self.profile  # type: ignore[assignment]  (only called with one)
        cost = profile.catch_up_cost(n) if first and self.last_logits else profile.cost(n)
        return cost + profile.context_slope(n) * max(before - CONTEXT_TOKENS, 0)

    def catch_up(self, tokens: int, context: int = 0) -> float | None:
        """Seconds to take in the last ``tokens`` of ``context`` committed tokens and draft one (None: no
        profile to say). That pass attends to the context before them, on past the longest context the
        profile measured (a small Q8_0 draft's 58-token pass: 2.2 ms after 16 tokens, 8.8 ms after 380,
        priced 9.2; the curve without the context said 1.3)."""
        if self.profile is None or self.per_token is None:
            return None
        tokens, before = self._fed(tokens, context)
        return self._scale * self._pass(tokens + 1, before, first=True) + self.overhead
