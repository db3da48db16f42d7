"""GainGuard: pause drafting whose measured rounds lose to plain steps.

Every decision of the adaptive schedule rests on estimates: a cost curve that bends as the
context grows, per-round work that is a tenth of a tiny model's pass, a miscalibrated
draft. The guard rests on what was measured. Each round that consulted the drafter is
scored by the tokens it gave minus the plain steps its time would have bought; when recent
rounds lost, drafting pauses for an interval that doubles while it keeps losing.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from itertools import islice
from typing import Sequence


class GainGuard:
    """The realized-gain guard of :class:`~specdec_gguf.schedule.AdaptiveSchedule`.

    A plain step's price is the median verify time of recent rounds that verified nothing.
    When the last ``window`` scored rounds (at least ``min_rounds``) lost more than
    ``tolerance`` of a plain step each on average, beyond ``slack`` tokens in all, and with
    evidence (``min_rounds`` verified rounds among them, or proposals costly by
    themselves), drafting pauses for ``first_pause`` rounds, doubling up to ``max_pause``.
    The last ``quiet_rounds`` rounds (at most ``window``) verifying nothing pause as soon as they
    lost more than ``tolerance`` each: what they lost is measured drafting time, with no bet's
    noise in it; such a pause lasts at least ``quiet_pause`` rounds, and at least as long as makes the
    ``quiet_again`` new rounds after it (enough then; ``quiet_rounds`` again once a round verified
    something) cost at most ``quiet_share`` of the rounds, at what the quiet rounds lost each.
    ``fresh_after_pause``: a pause on the window's losses (not a quiet one) empties the window, so the next
    verdict rests on rounds after it (``min_rounds`` of them); else the rounds it paused on stay, and the
    first round after the pause pauses again, for twice as long, unless it wins back what they lost, or
    (``resume_on_gain``) gains at all: then drafting goes on, and the next round that leaves the window losing
    pauses it, for the doubled interval.
    """

    def __init__(self, *, window: int, min_rounds: int, tolerance: float, slack: float, first_pause: int,
                 max_pause: int, quiet_rounds: int | None = None, quiet_pause: int | None = None,
                 quiet_again: int | None = None, quiet_share: float = 0.0, fresh_after_pause: bool = False,
                 resume_on_gain: bool = False) -> None:
        self.min_rounds, self.tolerance, self.slack = min_rounds, tolerance, slack
        self.fresh_after_pause, self.resume_on_gain = fresh_after_pause, resume_on_gain
        self.quiet_share = quiet_share
        self.quiet_rounds = window if quiet_rounds is None else min(quiet_rounds, window)
        self.quiet_again = self.quiet_rounds if quiet_again is None else min(quiet_again, self.quiet_rounds)
        self._quiet_needed = self.quiet_rounds  # quiet rounds that make the next verdict
        self.first_pause, self.max_pause = first_pause, max_pause
        self.quiet_pause = first_pause if quiet_pause is None else quiet_pause
        self._plain_times: deque[float] = deque(maxlen=16)  # seconds of recent rounds that verified nothing
        self._plain_round: float | None = None  # their median, recomputed after every 8 new ones
        self._plain_new = 0  # plain rounds since the median was computed
        self._gains: deque[float] = deque(maxlen=window)  # tokens over plain, per scored round
        self._verified: deque[bool] = deque(maxlen=window)  # whether each of them verified
        self._pause = 0  # rounds left without consulting the drafter
        self._interval = first_pause
        self._asked = False  # whether this round consulted the drafter
        self._quiet = 0  # scored rounds in a row that verified nothing
        self._after_pause = False  # the next scored round is the first after a pause

    def _sized(self, lost: float) -> int:
        """The pause after which ``quiet_again`` quiet rounds cost at most ``quiet_share`` of the rounds, each
        losing ``lost`` plain steps (what the quiet rounds before it lost on average; 0 without a share)."""
        if self.quiet_share <= 0.0:
            return 0
        return math.ceil(self.quiet_again * lost / self.quiet_share) - self.quiet_again

    def paused(self) -> bool:
        """Whether this round must be a plain step (counts the pause down)."""
        if self._pause:
            self._pause -= 1
            return True
        return False

    def claim_pause(self) -> int:
        """The rounds left of this pause, all at once: the caller makes each a plain step."""
        rounds, self._pause = self._pause, 0
        return rounds

    def asked(self) -> None:
        """This round consults the drafter: score it when it is recorded."""
        self._asked = True

    def record_plain_steps(self, draft_seconds: Sequence[float], verify_seconds: Sequence[float]) -> None:
        """``record(0, 1, d, s, after_verify=False)`` for each (d, s) of plain steps that follow plain steps
        (a pause's rounds, told together): the same state, without a loop in Python."""
        if not verify_seconds:
            return
        if self._asked:  # (the first is scored: the general way)
            self.record(0, 1, draft_seconds[0], verify_seconds[0], after_verify=False)
            draft_seconds, verify_seconds = draft_seconds[1:], verify_seconds[1:]
            if not verify_seconds:
                return
        times = self._plain_times
        # One by one, the median is dropped where 8 new ones have come, or while fewer than 8 are known.
        if self._plain_new + len(verify_seconds) >= 8 or len(times) + 1 < 8:
            self._plain_round = None
        times.extend(verify_seconds[-(times.maxlen or len(verify_seconds)):])
        self._plain_new += len(verify_seconds)

    def record(self, verified: int, generated: int, draft_seconds: float, verify_seconds: float, *,
               after_verify: bool) -> None:
        """A finished round, and whether the round before it verified drafted tokens. One that
        verified nothing took a plain step plus the proposal's price: it scores minus that price,
        free of the step's noise. A plain step right after a verify pass costs more (llama.cpp
        rebuilds its graph when the pass size changes): the round that verified is charged with
        that excess."""
        if verified == 0 and not after_verify:
            self._plain_times.append(verify_seconds)
            self._plain_new += 1
            if self._plain_new >= 8 or len(self._plain_times) < 8:
                self._plain_round = None  # a median of 16 is 2-3 us: not every round of a tiny model
        asked, self._asked = self._asked, False
        charge = verified == 0 and after_verify and bool(self._gains)
        if not (asked or charge):
            return  # a plain step between looks: nothing to score (the median waits until it is needed)
        if self._plain_round is None:
            if not self._plain_times:
                return  # no plain step measured yet
            self._plain_round, self._plain_new = statistics.median(self._plain_times), 0
        if charge:
            # (At most one plain step: a descheduled thread is not the graph's fault.)
            self._gains[-1] -= min(max(verify_seconds / self._plain_round - 1.0, 0.0), 1.0)
        if not asked:
            return
        after_pause, self._after_pause = self._after_pause, False
        if verified == 0:
            score = -draft_seconds / self._plain_round
        else:
            # A pass over n tokens costs at most about n plain steps: a descheduled thread must not
            # turn one slow round into a verdict.
            score = generated - min((draft_seconds + verify_seconds) / self._plain_round, 2.0 * (verified + 1))
        self._gains.append(score)
        self._verified.append(verified > 0)
        self._quiet = 0 if verified else self._quiet + 1
        if verified:
            self._quiet_needed = self.quiet_rounds  # (the drafter was worth asking: a whole window again)
        # A verdict needs evidence: the last rounds verifying nothing (their loss is the drafter's
        # measured time, not a bet's noisy outcome, so no slack: a lookup's search on a tiny model,
        # 4-8% of each round), or, over at least min_rounds, several verified rounds or proposals
        # that cost a lot by themselves.
        needed = self._quiet_needed
        quiet_lost = -sum(islice(reversed(self._gains), needed)) if self._quiet >= needed else 0.0
        quiet_loss = quiet_lost > self.tolerance * needed
        if not quiet_loss and len(self._gains) < self.min_rounds:
            return
        loss = -sum(self._gains) - self.tolerance * len(self._gains)
        # (The pause was the verdict on the rounds before it: the first after it that gains goes on.)
        resumed = after_pause and score > 0.0 and self.resume_on_gain
        if quiet_loss or (not resumed and loss > self.slack and (sum(self._verified) >= self.min_rounds
                                                                  or loss > self.slack * len(self._gains) / 8)):
            pause = max(self._interval, self.quiet_pause, self._sized(quiet_lost / needed)) if quiet_loss \
                else self._interval
            self._pause = min(pause, self.max_pause)
            self._after_pause = True
            self._interval = min(2 * self._pause, self.max_pause)
            # The next pause on quiet rounds needs new ones: a copy that began meanwhile shows in them.
            # After quiet rounds fewer: the drafter already showed it finds nothing here, and its first
            # search after a pause looks at everything the pause wrote.
            self._quiet = 0
            if quiet_loss:
                self._quiet_needed = self.quiet_again
            elif self.fresh_after_pause:  # (the pause was the verdict on these rounds)
                self._gains.clear()
                self._verified.clear()
        elif loss <= 0:
            self._interval = self.first_pause  # drafting pays again: the next pause starts short
