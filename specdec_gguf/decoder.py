"""SpeculativeDecoder: the propose -> verify -> accept/rollback loop."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from time import perf_counter
from typing import Callable, Iterable, Iterator, Literal, Sequence

import numpy as np

from . import calibrations as _calibrations
from . import sampling as _sampling
from .engine import DrafterEngine, SpeculativeEngine, check_tokens, reusable_prefix
from .errors import ConfigError, ContextOverflowError, SpecDecError
from .proposal import NO_PROPOSAL, DraftProposal, VerificationPolicy
from .sampling import SamplingParams
from .profile import distrust, profile_for
from .schedule import (AdaptiveSchedule, DraftSchedule, FixedSchedule, HindsightSchedule, PlainRunSchedule,
                       ScheduleConstants)
from .settings import default_num_draft_tokens
from .stats import SpecStats

Origin = Literal["accepted", "correction", "bonus", "target"]
StopReason = Literal["eog", "stop_token", "length", "context"]


@dataclass(frozen=True)
class RoundEvent:
    """What one round added: tokens, each token's origin, the live stats, and why it stopped (last round only)."""

    tokens: tuple[int, ...]
    origins: tuple[Origin, ...]
    stats: SpecStats
    stop_reason: StopReason | None = None


@dataclass(frozen=True)
class GenerationResult:
    """The generated tokens (stop tokens excluded), the run's stats and why it stopped."""

    tokens: list[int]
    stats: SpecStats
    stop_reason: StopReason


class SpeculativeDecoder:
    """Generate with ``target``, letting ``drafter`` propose up to ``num_draft_tokens`` per round.

    ``drafter=None`` is plain target-only decoding through the same loop (the fair
    baseline). By default (``adaptive=True``) each round verifies only the drafted tokens
    that pay for their place in the verify pass, judged from the target's measured cost
    profile (cached on disk, see profile.py; ``profile_cache=False`` measures afresh) and
    acceptance calibrated online, starting from what earlier runs of the same models learned
    (calibrations.py; ``remember=False``, or ``profile_cache=False``, neither reads nor
    writes it); ``num_draft_tokens`` is then an upper bound (default: 8
    for a draft model, 64 for prompt lookup). ``adaptive=False`` drafts and verifies a fixed
    ``num_draft_tokens`` (default 4) every round; ``constants`` tunes the adaptive schedule
    (:class:`ScheduleConstants`: benchmarks compare variants with it); ``schedule`` plugs in any
    other :class:`DraftSchedule`. Proposals shorter than ``draft_min`` are not verified. In sampled
    decoding a proposal the drafter drew at random (a draft model's) is verified whole: its length was
    settled while drawing it (``draft_min`` does not apply). Only a one-token one may be declined
    (``choose`` returning 0), and the plain step then verifies its token.
    Greedy output equals the target's own greedy output for any drafter and k; sampling
    follows Chen et al. (2023). ``clock`` times rounds (a virtual clock in simulations).
    """

    def __init__(self, target: SpeculativeEngine, drafter: DrafterEngine | None = None, *,
                 num_draft_tokens: int | None = None, adaptive: bool = True, draft_min: int = 0,
                 schedule: DraftSchedule | None = None, profile_cache: bool = True, remember: bool = True,
                 constants: ScheduleConstants | None = None, clock: Callable[[], float] = perf_counter) -> None:
        if num_draft_tokens is None:
            kind = drafter.name if drafter is not None and drafter.name == "prompt-lookup" else "draft-model"
            num_draft_tokens = default_num_draft_tokens(kind, adaptive)
        if not isinstance(num_draft_tokens, int) or not 1 <= num_draft_tokens <= target.n_ctx:
            raise ConfigError(
                f"num_draft_tokens={num_draft_tokens!r} must be an integer in [1, n_ctx={target.n_ctx}]")
        if not isinstance(draft_min, int) or not 0 <= draft_min <= num_draft_tokens:
            raise ConfigError(f"draft_min={draft_min!r} must be an integer in [0, num_draft_tokens={num_draft_tokens}]")
        if drafter is not None:
            drafter.check_target(target)  # before any generation: a mismatch would decode garbage
        self.target = target
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens
        self.draft_min = draft_min
        self.clock = clock
        # Where this drafter's calibration against this target is kept between runs (None: not kept).
        self._calibration_key: str | None = None
        self._remembered = {True: 0, False: 0}  # outcomes already passed on to the cache, per policy
        self._passed: dict[bool, _calibrations.Counts] = {}  # per-slot counts at the last pass-on, per policy
        # The schedule whose cached target profile a generation's end checks against the plain steps it ran.
        self._profiled: AdaptiveSchedule | None = None
        if schedule is None:
            if not adaptive:
                schedule = FixedSchedule(num_draft_tokens)
            elif drafter is None:
                schedule = FixedSchedule(num_draft_tokens)  # never consulted: plain decoding drafts nothing
            else:
                if profile_cache and remember:
                    self._calibration_key = _calibrations.pair_key(target, drafter)
                stored = _calibrations.recall_all(self._calibration_key)
                schedule = AdaptiveSchedule(
                    num_draft_tokens, target_costs=profile_for(target, use_cache=profile_cache),
                    draft_costs=profile_for(drafter.cost_engine, use_cache=profile_cache),
                    free_drafter=drafter.cost_engine is None, draft_catch_up=drafter.max_catch_up,
                    priors={greedy: drafter.acceptance_priors(greedy) for greedy in (True, False)},
                    calibrations=stored.calibrations, draft_scale=stored.draft_scale,
                    draft_overhead=stored.draft_overhead, calibration_odds=stored.calibration_odds(),
                    constants=constants)
                self._profiled = schedule if profile_cache and schedule.profile is not None else None
        self.schedule = schedule

    def generate(self, prompt_tokens: Sequence[int], max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(),
                 stop_token_ids: Iterable[int] | None = None, *, ignore_eog: bool = False) -> GenerationResult:
        """Run to a stop and return every generated token with the stats."""
        tokens: list[int] = []
        last: RoundEvent | None = None
        prompt = self._validate(prompt_tokens, max_new_tokens)
        # No caller code runs between these rounds, so nobody can touch the engines: no resume check.
        for last in self._rounds(prompt, max_new_tokens, sampling, frozenset(stop_token_ids or ()), ignore_eog,
                                 check_on_resume=False):
            tokens.extend(last.tokens)
        assert last is not None and last.stop_reason is not None  # stream always ends on a stop
        return GenerationResult(tokens=tokens, stats=last.stats, stop_reason=last.stop_reason)

    def stream(self, prompt_tokens: Sequence[int], max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(),
               stop_token_ids: Iterable[int] | None = None, *, ignore_eog: bool = False) -> Iterator[RoundEvent]:
        """Yield one RoundEvent per round; the last one carries ``stop_reason``.

        The stats object is live (updated in place); take ``.copy()`` to keep a snapshot.
        ``ignore_eog`` keeps generating past end-of-generation tokens (benchmarks).
        """
        prompt = self._validate(prompt_tokens, max_new_tokens)
        return self._rounds(prompt, max_new_tokens, sampling, frozenset(stop_token_ids or ()), ignore_eog)

    def _validate(self, prompt_tokens: Sequence[int], max_new_tokens: int) -> list[int]:
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ConfigError("the prompt is empty: give at least one token (e.g. BOS)")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1")
        if len(prompt) >= self.target.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but n_ctx={self.target.n_ctx} leaves no room to "
                f"generate; use a prompt shorter than {self.target.n_ctx} tokens or a larger context")
        check_tokens(prompt, self.target.n_vocab, "prompt token")
        return prompt

    def _rounds(self, prompt: list[int], max_new_tokens: int, params: SamplingParams,
                stops: frozenset[int], ignore_eog: bool, check_on_resume: bool = True) -> Iterator[RoundEvent]:
        target, drafter, schedule, clock = self.target, self.drafter, self.schedule, self.clock
        # (resolved once a generation: a runtime protocol check costs 3-7 us)
        hindsight = schedule.hindsight if isinstance(schedule, HindsightSchedule) else None
        observe_plain = schedule.observe_plain if isinstance(schedule, PlainRunSchedule) else None
        is_eog = (lambda token: False) if ignore_eog else target.is_eog
        policy, rng = VerificationPolicy.from_sampling(params), params.rng()
        greedy = policy.greedy
        stats = SpecStats(prompt_tokens=len(prompt))
        context = list(prompt)  # committed tokens; the cache holds all but the last (the anchor)
        mirror = np.zeros(min(target.n_ctx, len(prompt) + max_new_tokens), dtype=np.int32)  # context as an array
        mirror[: len(prompt)] = prompt
        try:
            t0 = clock()
            self._prefill(prompt[:-1])
            if drafter is not None:
                drafter.start(prompt)
            schedule.start(len(prompt))
            stats.prefill_seconds = clock() - t0  # (the drafter's and the schedule's setup for the prompt too)
            # Rounds the schedule said are plain steps whatever they show (a pause) run without asking
            # the schedule or telling it and the drafter round by round: they are told afterwards, all
            # together (a round's Python work right after a pass runs with cold caches: told round by
            # round, 5-7 us of a tiny model's 200 us round).
            plain_left = 0
            untold: list[tuple[list[int], float, float]] = []  # (committed, draft seconds, verify seconds)
            while True:
                t_round = clock()
                room = min(target.n_ctx - len(context), max_new_tokens - (len(context) - len(prompt))) - 1
                k = 0
                if drafter is not None and not plain_left:
                    if untold:
                        self._tell(untold, greedy, hindsight, observe_plain)
                    plain_left = schedule.plain_rounds()
                    if not plain_left:
                        k = min(schedule.next_k(room), room)
                deferred = plain_left > 0
                plain_left -= deferred
                proposal, refused_row = NO_PROPOSAL, None
                if k > 0:
                    proposal = drafter.propose(k, policy, rng, budget=schedule.budget(greedy)).prefix(k)
                    if proposal.parents is not None and not proposal.is_linear:
                        raise SpecDecError("the drafter proposed a tree; this decoder verifies linear proposals only")
                    proposal, refused_row = _fit_to_target(proposal, target.n_vocab)
                drafted = proposal
                if proposal.tokens and (greedy or not _drawn(proposal)):
                    chosen = schedule.choose(proposal, greedy)
                    proposal = proposal.prefix(chosen) if chosen else NO_PROPOSAL
                    if len(proposal.tokens) < self.draft_min:
                        proposal = NO_PROPOSAL  # too short to pay for a verify pass (llama.cpp's --draft-min)
                elif len(proposal.tokens) == 1 and not schedule.choose(proposal, greedy):
                    # A drawn proposal is verified whole: its length was settled while drawing it (a
                    # drafter draws on only where what it drew so far says more can pay), and a cut
                    # chosen from the drawn tokens themselves would skew which tokens get verified. Only
                    # a one-token one may be declined, as its token alone decides: the plain step then
                    # verifies that token.
                    proposal = NO_PROPOSAL
                t_verify = clock()
                out = target.forward_proposal(context[-1], proposal, greedy=greedy)
                # (A plain step's price: the pass alone, what plain decoding's rounds pay too.)
                t_passed = t_verify if proposal.tokens else clock()
                # A declined proposal still shows whether its first token was right: the plain step just
                # produced the target's own token there (greedy), or the chance it would have been
                # accepted (sampled).
                first_matched: bool | float | None = None
                chances: list[float] | None = None  # (sampled: each examined token's chance of acceptance)
                declined = bool(drafted.tokens) and not proposal.tokens
                if greedy:
                    n_acc, token = _sampling.greedy_accept(proposal.tokens, out)
                    if declined:
                        first_matched = drafted.tokens[0] == token
                elif declined and _drawn(drafted):
                    token, first_matched = _sampling.verify_declined(
                        drafted.tokens[0], drafted.draft_probs[0], out[0], params, rng)  # type: ignore[index]
                    n_acc = 0
                elif declined:
                    token, first_matched = _sampling.sample_declined(drafted.tokens[0], None, out[0], params, rng)
                    n_acc = 0
                else:
                    chances = [] if proposal.tokens else None
                    n_acc, token = _sampling.rejection_sample(
                        proposal.tokens, proposal.draft_probs, out, params, rng, refused_row=refused_row,
                        chances=chances)
                new = [*proposal.tokens[:n_acc], token]
                last: Origin = "target" if not proposal.tokens else (
                    "bonus" if n_acc == len(proposal.tokens) else "correction")
                origins: list[Origin] = ["accepted"] * n_acc + [last]
                stop_reason: StopReason | None = None
                for i, t in enumerate(new):
                    if t in stops or is_eog(t):
                        stop_reason = "stop_token" if t in stops else "eog"
                        del new[i:], origins[i:]
                        break
                mirror[len(context):len(context) + len(new)] = new
                context.extend(new)
                target.reset(len(context) - 1)
                if drafter is not None and not deferred:
                    drafter.accept(n_acc, new)
                t_end = clock()
                stats.record_round(len(proposal.tokens), n_acc, len(new), declined=declined)
                stats.verify_seconds += t_end - t_verify
                if not proposal.tokens:
                    stats.plain_step_seconds += t_passed - t_verify
                if deferred:
                    untold.append((new, t_verify - t_round, t_end - t_verify))
                else:
                    schedule.observe(drafted, len(proposal.tokens), n_acc, len(new), greedy,
                                     t_verify - t_round, t_end - t_verify, first_matched=first_matched,
                                     chances=chances)
                    if hindsight is not None:
                        hindsight(drafted, len(proposal.tokens), n_acc, new, greedy)
                if stop_reason is None:
                    if len(context) - len(prompt) >= max_new_tokens:
                        stop_reason = "length"
                    elif len(context) >= target.n_ctx:
                        stop_reason = "context"
                if stop_reason is not None and untold:
                    self._tell(untold, greedy, hindsight, observe_plain)
                # The schedule learning from the round is drafting's overhead too: a user waits for it.
                t_done = clock()
                stats.draft_seconds += (t_verify - t_round) + (t_done - t_end)
                stats.generation_seconds += t_done - t_round
                if stop_reason is not None:
                    try:
                        yield RoundEvent(tuple(new), tuple(origins), stats, stop_reason)
                    finally:
                        self._pass_on()
                    return
                yield RoundEvent(tuple(new), tuple(origins), stats, stop_reason)
                if check_on_resume and not _holds(target, mirror[: len(context) - 1]):
                    if untold:  # (before the drafter starts again from the context)
                        self._tell(untold, greedy, hindsight, observe_plain)
                    self._resync(context)  # another generation used the engine while this one was paused
        except GeneratorExit:
            # Closed (or garbage-collected) while paused at a yield: the caches were consistent
            # then, and may since belong to another generation or a closed engine. Touch nothing.
            raise
        except BaseException:
            self._restore(context)
            raise

    def _tell(self, untold: list[tuple[list[int], float, float]], greedy: bool,
              hindsight: Callable[[DraftProposal, int, int, Sequence[int], bool], None] | None,
              observe_plain: Callable[[Sequence[tuple[Sequence[int], float, float]], bool], None] | None) -> None:
        """Tell the drafter and the schedule about plain rounds run without them, in order (and forget them)."""
        schedule = self.schedule
        # The drafter takes all their tokens in one call (it was asked about none of them).
        self.drafter.accept(0, [token for committed, _, _ in untold for token in committed])  # type: ignore[union-attr]
        if observe_plain is not None:
            observe_plain(untold, greedy)
            untold.clear()
            return
        for committed, draft_seconds, verify_seconds in untold:
            schedule.observe(NO_PROPOSAL, 0, 0, len(committed), greedy, draft_seconds, verify_seconds)
            if hindsight is not None:
                hindsight(NO_PROPOSAL, 0, 0, committed, greedy)
        untold.clear()

    def _pass_on(self) -> None:
        """What a finished generation leaves for later runs, once its last tokens are out (the final event
        consumed, or the stream closed there): the calibration learned (``_remember``) and whether the
        cached profile was timed in a busy moment. No token waits for it (a draft model's store write,
        read-blend-write under a lock, took 1.0-1.4 ms of a 64-token tiny-wide answer, ~1%; fixed k, with
        nothing to store, paid none)."""
        if self._calibration_key is not None:
            self._remember()
        busy = self._profiled.busy_profile() if self._profiled is not None else None
        if busy is not None:
            self._profiled = None  # (once: the cache asks the next run for a round more)
            distrust(busy)

    def _remember(self) -> None:
        """Pass what the schedule's calibration learned since the last time on to the next runs."""
        if not isinstance(self.schedule, AdaptiveSchedule):
            return  # (a key is set only with the adaptive schedule this decoder built)
        # Only what rests on enough outcomes since the last pass-on (calibrations.worth_keeping's rule):
        # the schedule leaves the rest unrefitted.
        keep = self.schedule.learned({greedy: kept + _calibrations.MIN_OBSERVATIONS
                                      for greedy, kept in self._remembered.items()})
        for greedy, (_, outcomes) in keep.items():
            self._remembered[greedy] = outcomes
        # A draft model's outcomes since the last pass-on, which the store keeps pending where they taught
        # no calibration (calibrations.passed_on). (Counts past a slot's recency are scaled down: a decoder
        # that lives long passes on a little less.)
        short: dict[bool, tuple[_calibrations.Counts, Sequence[float]]] = {}
        for greedy, ((hits, outcomes), priors) in self.schedule.counts().items():
            then = self._passed.get(greedy, ([0.0] * len(hits), [0.0] * len(hits)))
            self._passed[greedy] = (hits, outcomes)
            self._remembered[greedy] = self.schedule.models[greedy].outcomes
            short[greedy] = ([max(0.0, a - b) for a, b in zip(hits, then[0])],
                             [max(0.0, a - b) for a, b in zip(outcomes, then[1])]), priors
        price = self.schedule.draft_price
        _calibrations.remember(self._calibration_key, {greedy: cal for greedy, (cal, _) in keep.items()},
                               _calibrations.pending_of(keep, short), price.take_scale(),
                               _calibrations.tested_of(self.schedule.models, short), price.take_overhead())

    def _prefill(self, prefix: list[int]) -> None:
        """Fill the target's cache with ``prefix``, reusing whatever leading part it already holds."""
        keep = reusable_prefix(self.target, prefix)
        self.target.reset(keep)
        if len(prefix) > keep:
            self.target.advance(prefix[keep:])

    def _resync(self, context: list[int]) -> None:
        """Make the target's cache (and the drafter, with its draft model's cache) follow ``context`` again."""
        self._prefill(context[:-1])
        if self.drafter is not None:
            self.drafter.start(context)

    def _restore(self, context: list[int]) -> None:
        """After an error, leave both engines at the committed context (best effort)."""
        try:
            self.target.reset(min(self.target.n_past, len(context) - 1))
        except SpecDecError:
            pass
        if self.drafter is not None:
            try:
                self.drafter.rollback()
            except SpecDecError:
                pass


def _holds(engine: SpeculativeEngine, committed: np.ndarray) -> bool:
    """Whether the engine's cache is exactly ``committed`` (its own record, compared in one numpy pass)."""
    tokens = engine.tokens
    if len(tokens) != len(committed):
        return False
    if not isinstance(tokens, np.ndarray):  # e.g. a tuple: fromiter converts it without a detour
        tokens = np.fromiter(tokens, dtype=np.int64, count=len(committed))
    return bool(np.array_equal(tokens, committed))


def _drawn(proposal: DraftProposal) -> bool:
    """Whether the drafter drew the proposal at random (it gave q): Chen et al.'s verification is
    exact only when whether a drawn token is verified is settled before it is drawn."""
    return proposal.draft_probs is not None


def _fit_to_target(proposal: DraftProposal, n_vocab: int) -> tuple[DraftProposal, np.ndarray | None]:
    """Cut a proposal before the first id the target cannot take, and size q's rows to the target's
    vocabulary. Also returns that id's q row where it was drawn (None otherwise).

    A draft vocabulary may be up to 128 ids larger than the target's (vocab.py). The target gives
    such an id probability 0: verified, a drawn one would be rejected for sure, so after the tokens
    before it are accepted the next token comes from the residual with its q row
    (``rejection_sample``'s ``refused_row``), not from p: the output stays exact. Dropping q's extra
    columns (or padding missing ones with 0) leaves acceptance and residuals as they were.
    """
    tokens, probs = proposal.tokens, proposal.draft_probs
    if (not tokens or (min(tokens) >= 0 and max(tokens) < n_vocab)) \
            and (probs is None or probs.ndim == 1 or probs.shape[1] == n_vocab):
        return proposal, None  # the common case, checked at C speed
    cut = next((i for i, t in enumerate(tokens) if not 0 <= t < n_vocab), len(tokens))
    refused: np.ndarray | None = None
    if probs is not None and cut < len(tokens):
        if probs.ndim != 2:
            raise SpecDecError(f"the drafter drew id {tokens[cut]}, outside the target's vocabulary of {n_vocab}: "
                               + _sampling.NEEDS_ROWS)
        refused = _aligned(probs[cut:cut + 1], n_vocab)[0]
    proposal = proposal.prefix(cut)
    probs = proposal.draft_probs
    if probs is not None and probs.ndim == 2 and probs.shape[1] != n_vocab:
        proposal = dataclasses.replace(proposal, draft_probs=_aligned(probs, n_vocab))
    return proposal, refused


def _aligned(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """q rows ``[n, V_draft]`` as ``[n, n_vocab]``: extra columns dropped, missing ones 0."""
    aligned = np.zeros((len(rows), n_vocab), dtype=rows.dtype)
    width = min(n_vocab, rows.shape[1])
    aligned[:, :width] = rows[:, :width]
    return aligned
