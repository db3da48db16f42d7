"""Draft schedules: how many tokens to draft each round (k = 0 is a plain step)."""

from __future__ import annotations

import statistics
from collections import deque
from typing import Protocol, runtime_checkable

from .errors import ConfigError


@runtime_checkable
class DraftSchedule(Protocol):
    """Chooses k before each round and learns from what the round cost and kept."""

    def start(self) -> None:
        """A new generation begins."""
        ...

    def next_k(self) -> int:
        """Tokens to draft this round (the decoder clips it to the room left)."""
        ...

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """What the last round drafted, accepted and spent."""
        ...


class FixedSchedule(DraftSchedule):
    """Always draft ``k`` tokens."""

    def __init__(self, k: int) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"num_draft_tokens={k!r} must be an integer >= 1")
        self.k = k

    def start(self) -> None:
        return None

    def next_k(self) -> int:
        return self.k

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        return None


class AdaptiveSchedule(DraftSchedule):
    """Choose the k in [0, k_max] that maximises expected tokens per second, measured online.

    Cost model (Leviathan et al. 2023, with measured curves instead of constants):
    a round drafting k tokens costs ``draft_per_token * k + verify(k + 1)`` and yields
    ``E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i`` tokens, where ``a_i`` is the measured
    chance that slot i is accepted given the slots before it were (a moving average).
    ``verify(n)`` and ``draft_per_token`` are medians of the last 15 measurements,
    interpolated linearly between measured batch sizes. When k = 0
    wins (drafting doesn't pay), a probe round drafts again now and then, with the
    interval doubling while probes keep losing; when drafting wins, a plain round now
    and then keeps the baseline cost current. The state persists across generations
    on the same decoder, so what one prompt taught carries to the next.
    """

    def __init__(self, k_max: int, *, smoothing: float = 0.15, probe_interval: int = 8,
                 max_probe_interval: int = 512) -> None:
        if not isinstance(k_max, int) or k_max < 1:
            raise ConfigError(f"num_draft_tokens={k_max!r} must be an integer >= 1")
        self.k_max = k_max
        self.smoothing = smoothing
        self.base_probe_interval = probe_interval
        self.max_probe_interval = max_probe_interval
        self.accept_rate = [0.6] * k_max  # prior a_i, replaced by the first observation
        self.verify_seconds: dict[int, float] = {}  # batch size n -> mean seconds
        self.draft_per_token = 0.0
        self.window = 15
        self._verify_window: dict[int, deque[float]] = {}
        self._draft_window: deque[float] = deque(maxlen=self.window)
        self._sizes: list[int] = []  # sorted keys of verify_seconds
        self._slot_count = [0] * k_max
        self._rounds_since_draft = 0
        self._probe_interval = probe_interval
        self.replan_every = 8
        self.refresh_plain_every = 48
        self._rounds_since_plain = 0
        self._plan: int | None = None
        self._probe_k = k_max
        self._since_plan = 0

    def start(self) -> None:
        return None  # what was learned, and the probe timer, carry over to the next generation

    # -- model ---------------------------------------------------------------------------
    def expected_tokens(self, k: int) -> float:
        """E(k): tokens one round drafting k yields, from the per-slot acceptance."""
        total, reach = 1.0, 1.0
        for a in self.slot_rates()[:k]:
            reach *= a
            total += reach
        return total

    def slot_rates(self) -> list[float]:
        """Per-slot acceptance; a slot never observed yet borrows the slot before it (optimism
        that gets the slot tried and measured, instead of a prior that could hide it forever)."""
        rates = list(self.accept_rate)
        for i in range(1, len(rates)):
            if self._slot_count[i] == 0:
                rates[i] = rates[i - 1]
        return rates

    def verify_cost(self, n: int) -> float | None:
        """Measured or interpolated seconds of a verify pass over n tokens (None: no data)."""
        known = self.verify_seconds
        if n in known:
            return known[n]
        if not known:
            return None
        sizes = self._sizes
        below = [s for s in sizes if s < n]
        above = [s for s in sizes if s > n]
        if below and above:
            lo, hi = below[-1], above[0]
            return known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
        if len(sizes) == 1:
            return None
        lo, hi = (sizes[-2], sizes[-1]) if below else (sizes[0], sizes[1])
        slope = max((known[hi] - known[lo]) / (hi - lo), 0.0)
        return max(known[lo] + slope * (n - lo), 0.0)

    def throughput(self, k: int) -> float | None:
        """Predicted tokens per second of a round drafting k (None: unknown yet)."""
        cost = self.verify_cost(k + 1)
        if cost is None:
            return None
        return self.expected_tokens(k) / (cost + self.draft_per_token * k)

    def best_k(self) -> tuple[int, float | None]:
        """The k with the highest predicted throughput, and that throughput."""
        best, best_rate, _ = self._plan_once()
        return best, best_rate

    def _plan_once(self) -> tuple[int, float | None, int]:
        """One pass over k: (best k, its predicted throughput, best k >= 1 for probes)."""
        costs = self._cost_table()
        rates = self.slot_rates()
        best, best_rate, probe, probe_rate = self.k_max, None, self.k_max, None
        expected, reach = 1.0, 1.0
        for k in range(self.k_max + 1):
            if k:
                reach *= rates[k - 1]
                expected += reach
            if costs is None:
                continue
            rate = expected / (costs[k] + self.draft_per_token * k)
            if best_rate is None or rate > best_rate:
                best, best_rate = k, rate
            if k and (probe_rate is None or rate > probe_rate):
                probe, probe_rate = k, rate
        return best, best_rate, probe

    def _cost_table(self) -> list[float] | None:
        """verify_cost(n) for n = 1 .. k_max + 1 in one go (None until two sizes are measured)."""
        if len(self.verify_seconds) < 2:
            return None
        return [c if c is not None else 0.0 for c in (self.verify_cost(n) for n in range(1, self.k_max + 2))]

    # -- schedule ----------------------------------------------------------------------------
    def next_k(self) -> int:
        if 1 not in self.verify_seconds:
            return 0  # measure a plain pass first
        if len(self.verify_seconds) < 2:
            # Then a short draft: cheap if the drafter is poor; slot optimism widens k if it is good.
            return min(self.k_max, 3)
        if self._plan is None or self._since_plan >= self.replan_every:
            # Re-plan every few rounds, not every round: the estimates move slowly and a plan costs ~20 us.
            self._plan, _, self._probe_k = self._plan_once()
            self._since_plan = 0
        if self._plan > 0:
            self._probe_interval = self.base_probe_interval
            if self._rounds_since_plain >= self.refresh_plain_every:
                return 0  # now and then a plain pass, so the baseline cost stays current too
            return self._plan
        if self._rounds_since_draft >= self._probe_interval:
            # Probe with the best drafting k so acceptance and cost estimates stay current.
            self._probe_interval = min(self._probe_interval * 2, self.max_probe_interval)
            return self._probe_k
        return 0

    def observe(self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        self._since_plan += 1
        n = drafted + 1
        if n not in self.verify_seconds:
            self._sizes = sorted([*self.verify_seconds, n])
            self._verify_window[n] = deque(maxlen=self.window)
        # A median over recent passes: timing noise (a descheduled thread) is one-sided and
        # bursty, and one slow sample must not make a size look expensive for long.
        window = self._verify_window[n]
        window.append(verify_seconds)
        self.verify_seconds[n] = statistics.median(window)
        if drafted == 0:
            self._rounds_since_draft += 1
            self._rounds_since_plain = 0
            return
        self._rounds_since_plain += 1
        self._rounds_since_draft = 0
        self._draft_window.append(draft_seconds / drafted)
        self.draft_per_token = statistics.median(self._draft_window)
        # Slots 1..accepted were accepted; slot accepted+1 (if drafted) was the first rejection.
        for i in range(min(accepted + 1, drafted)):
            self._slot_count[i] += 1
            hit = 1.0 if i < accepted else 0.0
            self.accept_rate[i] += self._weight(self._slot_count[i]) * (hit - self.accept_rate[i])

    def _weight(self, count: int) -> float:
        """A plain mean over the first observations, then an exponential moving average."""
        return max(self.smoothing, 1.0 / count)
