"""Draft schedules: how many drafted tokens each round verifies (0 is a plain step).

The adaptive schedule verifies a token only where its expected gain pays for what it
costs. Costs come from a measured :class:`~specdec_gguf.profile.CostProfile`, refined
online (:mod:`~specdec_gguf.costfit`); each token's chance of acceptance comes from the
drafter's bucket for it, calibrated online (:class:`~specdec_gguf.confidence.AcceptanceModel`).

Why this rule: generating at the best long-run rate λ (tokens per second) means each
round should maximise ``E(k) − λ·C(k)`` (renewal-reward / Dinkelbach), where
``E(k) = 1 + Σ_{j≤k} Π_{i≤j} c_i`` is the expected number of tokens a round verifying
k drafted tokens yields and ``C(k)`` what it costs. λ is estimated by the realized rate,
never below plain decoding's ``1 / T(1)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import add
from typing import Mapping, Protocol, Sequence, runtime_checkable

from .confidence import AcceptanceModel, slot_group
from .costfit import DraftPrice, VerifyCosts
from .errors import ConfigError
from .guard import GainGuard
from .profile import BUSY_PROFILE, CostProfile
from .proposal import NO_PROPOSAL, DraftProposal
from .settings import MAX_CATCH_UP


@dataclass(frozen=True)
class ScheduleConstants:
    """The adaptive schedule's constants, each with why."""

    # A drafted token must beat plain decoding by this share of a plain round to be verified:
    # estimates are noisy, and a wrong "yes" costs a whole extra pass position.
    margin: float = 0.03
    # Starting a draft-model proposal at all must beat plain by this much: the draft passes are paid
    # even when nothing ends up verified, and the value estimate assumes the next tokens are as sure.
    draft_margin: float = 0.08
    # Recent rounds the online cost fit uses: enough to be robust (medians: a descheduled thread
    # makes one pass slow), few enough to follow a context that grows (attention costs grow with it).
    cost_window: int = 48
    # Weight of each round in the realized-rate estimate λ (about the last 30 rounds count).
    rate_smoothing: float = 1 / 30
    # Prior weight (pseudo-observations) of a drafter's bucket priors: a few outcomes outweigh them.
    prior_strength: float = 3.0
    # A bucket remembers about this many outcomes, so estimates follow a drafter whose accuracy drifts.
    recency: float = 64.0
    # Per-slot prior where a drafter gives no buckets: a coin flip, the neutral guess.
    slot_prior: float = 0.5
    # A costly drafter (a draft model) that doesn't pay looks again now and then, the interval
    # doubling from this many rounds up to the maximum, so a change (a copy starts) is noticed cheaply.
    probe_interval: int = 8
    max_probe_interval: int = 256
    # ... and only once the rounds since the last look make its price (the draft catching up on the
    # tokens committed since, then drafting one) at most this share of their time, and while what
    # drafting could gain over the tokens left earns that price back (AdaptiveSchedule._earns_back).
    probe_share: float = 0.02
    # Without a cost profile, a plain round every this many keeps T(1) current.
    plain_refresh: int = 64
    # Look this many tokens ahead when deciding whether drafting one more token can pay
    # (cost curves are not convex: T(3) - T(2) can be far below T(2) - T(1)).
    lookahead: int = 4
    # A costly drafter's start value (AdaptiveSchedule._first_token_value) weighs runs as long as the
    # longest pass verified so far, not only lookahead tokens: λ is the realized rate, earned by such
    # passes, and valued 4 tokens deep a pair whose 8-token passes ran 1.5x plain saw starting at all as
    # worth ~0.08 tokens (draft_margin) and paused 8-11 rounds at a time (the deep pair sampled at T = 0.8).
    # (Not as long as the cap allows before any such pass: the priors alone then bet on it, and a pair
    # where nothing pays, simulated on gemma-epyc, drafted its way to 0.928x plain.)
    start_to_longest: bool = True
    # ... and prices time at no more than the best rate such a round offers, as choose does (not the realized
    # rate alone: after a lucky streak of fully accepted passes it exceeds anything drafting can be expected
    # to give, and the start value then says plain steps, whose price λ·T(1) is the least, are better).
    # Both side by side on the deep pair sampled at T = 0.8 (docs/performance.md, "twenty-eighth"): 1 thread
    # 1.281x plain paired against 1.192x; 2 threads 1.199x / 1.146x (the first alone), 1.327x / 1.322x,
    # 1.236x (null arm 1.222x) / 1.220x; tiny F32 draft 0.982x / 0.971x, tiny-wide greedy and sampled within
    # the null arms' spread; where drafting clearly pays or never does, no decision changes.
    start_rate_cap: bool = True
    # A generation's first proposals, this many, may make a draft model's price lower than priced now, never
    # higher: their caches are cold from the prefills. Fresh tiny-wide decoders (three processes, five
    # answers each) read their first proposal at a median 1.0x-1.6x the profile (up to 2.6x), the second
    # at 0.9x-1.4x (up to 2.0x; 2.4x-2.9x in a process where every answer stalled), the later ones 1.0x-1.3x.
    # Two such readings alone in the window priced a draft that pays 1.5x out of the run: its first tokens
    # right but not yet believed (the calibration refits after four), its looks unaffordable after.
    cold_proposals: int = 2
    # A draft model's price starts from what its proposals cost in earlier runs of the pair over the profile's
    # price (calibrations.py keeps it; DraftPrice.take_scale), not from the profile alone: the profile times
    # passes back to back, a run's follow target passes (the draft's weights evicted from the CPU caches) and
    # carry the drafter's own work per token. A tiny F32 draft at 1 thread ran at 2x its price; a fresh
    # decoder priced it at the profile's, drafted when the target's steps grew dearer with the context, and
    # lost 3-6% of 256-token answers (0.962x-0.966x plain paired; remembered: 0.995x).
    remember_draft_price: bool = True
    # A proposal costs more than its shaped passes by about the same each, whatever its length: the drafter's
    # own work per proposal, and a first pass after a target pass that evicted the draft's weights (model 167:
    # 1.1-1.4 ms a proposal and 0.72-1.27 ms a drafted token on tiny-wide, tiny-big-q8, tiny-gqa12-q4k and the
    # 24-layer pair, against 0.26-1.0 ms and 1.02-1.27 ms priced by one scale, which a window of 8-token
    # proposals sets to their average: each further token priced up to 48% dearer than it is (the 24-layer
    # pair's at par), each proposal's start cheaper). The price fits the two apart (DraftPrice._fit_overhead)
    # and remembers both. False: one scale.
    draft_overhead: bool = True
    # A draft's catch-up (its first pass of a proposal: the tokens committed since the last, then the anchor)
    # asks for the last position's logits: priced from the profile's context prefill per token
    # (CostProfile.catch_up_cost), not as a verify pass over as many tokens, which computes every position's
    # (129 tokens after a pause: priced 3.1x their cost on Gemma 3 270M, 3.4x on a tiny F32 draft).
    catch_up_from_prefill: bool = True
    # The first verify passes of a decoder hold at most this many drafted tokens (or as many as the
    # largest pass the cost profile measured); then at most twice the longest verified so far: the
    # costs of long passes are confirmed before they are bet on. On steep curves (one thread: a
    # 3-token pass costs 3.1 one-token passes) nothing short pays, so the profile's sizes matter.
    first_verify_cap: int = 2
    # Whether a cost profile's measured sizes lift that first cap (False: always start at it).
    trust_profile_sizes: bool = True
    # Where the profile doesn't vouch for the context (a long prompt on a small model, see start), prompt
    # lookup's proposals are only looked at (declined: the plain step shows whether the first token was
    # right) until one is right: a first 2-token bet there cost a tiny F32 model ~2.7 plain steps for
    # ~2.4 tokens at best, and its copies were wrong (tiny F32 lookup, 2 threads, 64 tokens: 0.968x ->
    # 0.979x plain; tiny-wide and tiny-mid-q8 within the noise). Models with no long-context timing
    # (Gemma 3 270M) are always vouched for.
    look_first: bool = True
    # When a pass longer than the cap looks best but the best within the cap is shorter (cost curves
    # with a bump: T(5) far above T(3) yet T(17) cheap per token), verify up to the cap anyway, once
    # this many rounds in a row were fully accepted: a copy that has run that long likely goes on.
    # Fewer (2-4) bet long passes on short quotes that end soon (simulation: 0.95x plain).
    explore_streak: int = 6
    # How fast the counts of which bucket comes first forget (about the last 30 proposals count).
    first_bucket_decay: float = 0.97
    # Rounds, and seconds of generation, between rebuilds of the cost table from the online timings
    # (both must pass): estimates move slowly, and a rebuild with what depends on it (medians over
    # windows, the start decision) costs 20-60 us: 10% of a tiny model's round if done every 8.
    refresh_costs_every: int = 8
    refresh_costs_seconds: float = 0.04
    # ... and each rebuild prices a pass over n tokens at no more than ceil(n / m) of this run's passes over m
    # tokens, for each size m it verified (VerifyCosts bound_by_passes): the online fit keeps the profile's
    # shape for sizes it doesn't verify, and a size the profile prices too dear is never verified. A profile
    # whose 5- and 9-token passes were timed at 1.6x what they cost kept the demo at 2-token passes, 2.1x plain
    # against 3.8x (3.1x with the bound; the first run after installing on the model 167 host verified 2 tokens a
    # pass alike to the end, 2.07x); a correct profile's curve is never above the bound (a pass is never dearer
    # than the passes splitting it). Simulated and timed on right profiles: level (docs/performance.md,
    # "forty-fifth").
    bound_by_passes: bool = True
    # The realized-gain guard (guard.py): when the last ``guard_window`` rounds that consulted the
    # drafter (at least ``guard_min_rounds``) lost more than ``guard_tolerance`` of a plain step each,
    # drafting pauses for probe_interval rounds, doubling up to ``guard_max_pause``. The tolerance
    # lets a lookup's search (a few us) run on through open text where it costs nothing that matters.
    guard_window: int = 24
    guard_min_rounds: int = 8
    guard_tolerance: float = 0.02
    guard_slack: float = 2.0  # tokens: one long wrong pass is part of drafting, not a verdict
    guard_max_pause: int = 64
    # Rounds in a row verifying nothing after which a free drafter (prompt lookup) whose searches cost
    # more than the tolerance pauses, and new ones needed after a pause: nothing else limits its
    # searches (a tiny model: 24 rounds of 5-10% each as a full window), and a copy that starts
    # meanwhile is found a pause late. Only where a search costs more than the tolerance of a pass
    # (tiny models; on Gemma 3 270M a search is ~0.1% of a pass and never pauses): 8 left tiny F32
    # lookup 1.5% slower (0.955x -> 0.971x plain, six runs over 1 and 2 threads, 64 and 256 tokens).
    # A costly drafter's looks are limited by probe_share and teach its calibration: a full window.
    guard_quiet_rounds: int = 4
    # A pause for such quiet rounds lasts at least this long (doubling from there): they lost only the
    # searches' time, and pauses as short as a lost bet's (probe_interval) left a third of a short
    # answer consulting: a tiny F32 model (a search ~11% of a round) lost 5% of a 64-token answer
    # with 8, 3.4% with 16. A copy that starts meanwhile is found at most one pause later.
    guard_quiet_pause: int = 16
    # After such a pause this many quiet rounds make the next verdict (a whole window again once a
    # round verifies something): the first search after a pause looks at all the pause wrote, and 8
    # more consulted rounds per pause were ~25 us each on a tiny F32 model's 150-300 us rounds.
    guard_quiet_again: int = 2
    # ... and such a pause is at least as long as makes those new quiet rounds cost at most this share of
    # the rounds, at what the quiet rounds before it lost each (at most guard_max_pause): where a search
    # is a tenth of a step, 16 and 32 let the two consulted rounds after each pause and the round that
    # tells it cost ~4% of a 64-token tiny F32 answer. Side by side (100 repeats, 64 tokens, paired): tiny
    # F32 lookup 0.969x -> 0.975x plain at 1 thread, worst prompt 0.952x -> 0.971x; 2 threads 0.975x ->
    # 0.982x, worst 0.958x -> 0.975x (a copy in code-edit found later: 1.013x -> 0.986x); 256 tokens 0.963x
    # -> 0.982x; tiny-mid-q8 and tiny-wide unchanged. A search costing under guard_tolerance of a step
    # (Gemma 3 270M: ~0.2%) never makes such a verdict, so it changes nothing there.
    guard_quiet_share: float = 0.002
    # A free drafter's (prompt lookup's) pause on its window's losses empties the window (GainGuard
    # fresh_after_pause): the next verdict needs rounds of its own. With the rounds it paused on kept, the
    # first round after each pause paused again, for twice as long, unless it won back what they lost: simulated
    # on the Gemma held-out answers with the EPYC host's 2-thread curve, `tips` remembered went 0.945x -> 0.989x
    # plain and the worst in turn 0.954x (`csv-to-json`) -> 1.050x (the rounds after the pause found the copy),
    # judge.py +0.25% held out, +0.09% tuning, no worst trace lower in 80 simulations. Side by side on the model
    # 167 host, where lookup's pauses on lost bets are rare: level (Gemma held out 2 threads 1.793x against
    # 1.789x, Q8_0 1 thread 1.764x against 1.768x, tiny F32 0.973x against 0.971x; docs/performance.md,
    # "forty-third").
    # Not for a draft model: each round after a pause pays the draft's catch-up and passes, and emptied
    # windows (their losses forgotten) lost the 24-layer pair's worst traces (0.963x -> 0.927x in turn).
    guard_fresh_after_pause: bool = True
    # The first round after a pause on the window's losses that gains (more tokens than plain steps in its
    # time) resumes drafting rather than pausing again for twice as long (GainGuard resume_on_gain): the
    # losses still in the window pause it again at the next round that leaves it losing, so a pair where
    # drafting doesn't pay loses at most one more round per pause, and one where it pays on average, after
    # a hard stretch, no longer sits out 8 + 16 rounds of a 64-token answer. Simulated (judge.py tuning /
    # heldout): +0.02% / +0.21%, no worst trace lower by 1% in 96 simulations (three by 0.3%-0.8%); Gemma
    # drafted by its first 12 blocks at a cheap draft's price +1.7% to +3.5% over the traces. Timed side by
    # side: level (docs/performance.md, "forty-fifth"). Prompt lookup's window starts afresh after a pause
    # (above), so its first round after one makes no verdict either way.
    guard_resume_on_gain: bool = True
    # Declined prompt-lookup proposals teach the calibration only when their first token's bucket is
    # within this of what may be verified (see observe).
    unverified_band: float = 0.1
    # A remembered calibration takes effect before the first regular refit once this run's outcomes
    # favour it over the drafter's priors as given by this likelihood ratio (AcceptanceModel). At 8, a
    # tiny-wide draft's first two right tokens fell just short (ratio 7.1: a third one-token round).
    # Lower ratios (4, 2) let an unlucky start (a hard stretch first) bet on what other prompts taught
    # (simulation, underconfident draft remembered: worst 0.954x -> 0.908x plain); 6 moved no worst case.
    # Prompt lookup takes the same: a ratio of its own (5) gained only while stored calibrations
    # compounded; since runs pass on their own fit, 5 and 6 ran alike side by side on Gemma 3 270M (two
    # hosts, 1 and 2 threads, 64 tokens) and in every simulation; at 3 quote-article fell to 0.94x plain
    # at 1 thread (a calibration learned on copies, taken after two rounds, bet 16-20-token passes on
    # its 1- and 2-token matches). On the EPYC host two right tokens gave tiny-wide 5.4, yet 5 and 4
    # gained it under 1% of the best fixed k and cost the underconfident draft's worst (0.908x -> 0.875x).
    early_evidence: float = 6.0
    # A draft model's run starts from the odds the stored calibration's track record gives (calibrations.py:
    # of the earlier runs that started from it, how many it predicted better than the priors as given), at
    # most these: a record of agreeing runs halves the evidence this run must add (6 -> 3: a tiny-wide draft's
    # first right token or two), one of disagreeing runs raises it without bound. Simulated on the recorded
    # pairs with the model 167 host's curves, in turn: tiny-wide 0.853x -> 0.908x its best fixed k on the default
    # set at 64 tokens, the 16-layer pair 0.958x -> 0.995x; judge.py tuning +0.16%, no worst trace lower in 49
    # simulations. early_evidence 3 for every run gained alike but lost the 24-layer pair's worst traces (0.963x
    # -> 0.936x plain), whose agreement is the prompt's; a bound of 2.7 lost one (tiny-big-q8 1.177x -> 1.146x).
    # Side by side (docs/performance.md, "fortieth"): tiny-wide at 1 thread +4%-5% (0.84x -> 0.87x k = 8), nine
    # other rows (greedy and sampled, Gemma F16 drafted by its Q4_K_M) level within their null arms. 1: the
    # record unread.
    record_odds_bound: float = 2.0
    # Sampled, before a costly drafter pauses (the start value says drafting doesn't pay) while the calibration
    # it remembered still waits for the first refit, the calibration takes in the outcomes so far: a pause
    # brings none, so such a run went on at the priors (set below every pair measured), and its looks were
    # priced out as the tokens to catch up on grew (tiny-wide at T = 0.8: 2 of 60 answers three declined
    # one-token draws, then all plain; none with it). Kept for that defect, not for a measured speed: side by
    # side on four pairs it moved the paired ratios -0.2% to +2.3% (docs/performance.md, "thirtieth"). Greedy
    # the simulated suites lost worst cases to it (0.970x -> 0.949x plain): there the first outcomes are
    # sharper evidence, and a pause on them is a verdict.
    refit_before_pause: bool = True
    # Prompt lookup leans on a remembered calibration only as far as this run's outcomes make it the
    # likelier one (AcceptanceModel(weigh_calibration=)): one learned on copies, taken whole at the first
    # refit, bet 16-33-token passes on an answer editing every ~7th token (simulated in turn: 0.90x
    # plain, 1.22x cold). A draft model's agreement is the pair's, whatever the prompt: taken whole (weighed,
    # the underconfident draft's worst fell 0.924x -> 0.907x, tiny F32's 0.969x -> 0.946x).
    lookup_weighs_remembered: bool = True
    # Greedy prompt lookup: a proposal's tokens that were not verified are followed against the tokens
    # the target commits next, up to the first that differs, and teach the calibration what verifying
    # them would have shown, each as this share of an outcome (0: not followed). Without them a run
    # that only looks learns nothing of its proposals' later tokens, and a few verified rounds swing the
    # pooled shifts d1, d2. Side by side on Gemma 3 270M (Q4_K_M, Q8_0, F16; 1 and 2 threads; default
    # and short sets, 64 tokens; a calibration store per arm) ten rows moved 0.939x-1.034x, 0.999x
    # geomean, the worst prompt better in five rows (Q8_0 1 thread short 0.976x -> 1.036x plain) and
    # worse in three (Q8_0's default set at 1 thread, the steepest curve, lost 2-6%); simulated, the
    # steep one-thread curves' worst traces lost 1-3% (a bet taken sooner) while the two-thread ones
    # gained up to 19%. At 1 (as much as a verified token, though the same tokens teach the proposals
    # that draft them again) Q8_0's one-thread worst lost more (simulated 0.969x -> 0.927x plain);
    # counting a fully accepted round's bonus token too, chat-like synthetic answers that copy a little
    # lost 10% (worst 0.971x -> 0.877x).
    hindsight_weight: float = 0.5
    # Prompt lookup: choose weighs verifying part of a proposal now and the rest next round (the copy is
    # proposed again for nothing) against verifying it all at once (AdaptiveSchedule._first_of_two): a
    # hedge where one long pass costs nearly as much as two short ones. Without timing noise (every recorded
    # Gemma and tiny-pair suite) the worst traces rose in six rows (exact kernels at 1 thread 0.917x ->
    # 0.936x plain), fell in one (0.977x -> 0.973x), geomean +0.08%. Side by side on Gemma 3 270M (nine rows
    # over Q4_K_M, Q8_0 and F16, 1 and 2 threads; a store per arm) the geomeans moved -2.7% to +3.7% and the
    # worst prompt (mostly quote-article, whose quotes end soon) rose in six, fell at most 0.5%: within the
    # noise of such runs (docs/performance.md, "twenty-second").
    split_passes: bool = True
    # Sampled, a draft model draws one more token only where that can pay, guessing how sure the next
    # draw will be: from the draws' average (the buckets weighed by how often drawn tokens fall in them),
    # not from the token just drawn, as greedy drafting guesses. A drawn token's q(x) says little of the
    # next draw's (a confident draft's less likely token is followed by a sure one as often), and a
    # drawn proposal is verified whole (no cut after drawing). Side by side at T = 0.8 and 1.0, several
    # seeds, a null arm (docs/performance.md, "twenty-fifth"): tiny-big-q8 +0% to +13%, tiny F32
    # +1.6% / +2.2% (0.974x plain) and once -2% (its null arms 1% apart), tiny-wide +10%, +12% and once
    # -6%, Gemma F16 drafted by its Q4_K_M (where nothing pays) 1.006x against 0.997x-1.000x.
    sampled_mean_guess: bool = True
    # Sampled, each verified token teaches the calibration its chance of acceptance min(1, p(x)/q(x))
    # (known once the target's row is in), not whether the coin accepted it: the same outcome on
    # average, with far less noise (0/1 outcomes read a deep-pair draft at ~0.86 a token, T = 0.8, as
    # sure after three lucky 8-of-8 rounds). Throughput side by side moved within the noise
    # (docs/performance.md, "twenty-seventh": tiny-wide eight runs over two temperatures and four seeds
    # 0.88x-1.08x, geomean 0.998x; tiny-big-q8 0.97x / 0.99x; tiny F32 1.00x; Gemma lookup 0.96x / 1.02x):
    # kept as the lower-variance estimate of the same thing, not for a measured gain.
    sampled_chances: bool = True


@runtime_checkable
class DraftSchedule(Protocol):
    """Chooses how much to draft and verify each round, and learns from what the round cost and kept."""

    def start(self, context: int) -> None:
        """A new generation begins after a prompt of ``context`` tokens."""
        ...

    def plain_rounds(self) -> int:
        """How many rounds from now are plain steps whatever they show (a pause; 0: ask ``next_k``). The
        decoder runs them without consulting the schedule or the drafter and tells both about them
        afterwards, before it asks again: the schedule round by round, in order (``observe``), the
        drafter all their tokens at once (``DrafterEngine.accept``)."""
        ...

    def next_k(self, room: int) -> int:
        """Most tokens to ask the drafter for this round (0: a plain step), with ``room`` tokens left to
        generate after this round's first; the decoder clips it to ``room``."""
        ...

    def budget(self, greedy: bool) -> DraftBudget | None:
        """What a drafter consults while drafting (None: draft ``next_k`` tokens)."""
        ...

    def choose(self, proposal: DraftProposal, greedy: bool) -> int:
        """How many of ``proposal``'s tokens to verify (the decoder asked for no more than the
        generation has room for). For a proposal a drafter drew at random (sampled decoding with a
        draft model: it carries q) the decoder asks only about a one-token one (0 declines it) and
        verifies longer ones whole: exactness forbids choosing from the drawn tokens themselves."""
        ...

    def observe(self, proposal: DraftProposal, verified: int, accepted: int, generated: int, greedy: bool,
                draft_seconds: float, verify_seconds: float, first_matched: bool | float | None = None,
                chances: Sequence[float] | None = None) -> None:
        """The round's proposal, how many of its tokens were verified and accepted, how many tokens
        it generated, and what drafting and verifying cost. ``first_matched``: for a proposal none of
        whose tokens was verified, whether its first token was right: for greedy decoding, whether
        it is the one the plain step produced; for sampled decoding, the chance speculative sampling
        would have accepted it (None otherwise). ``chances``: sampled, each verified token's chance of
        acceptance min(1, p(x)/q(x)), up to and including the first rejected one (None: greedy)."""
        ...


@runtime_checkable
class HindsightSchedule(Protocol):
    """A draft schedule that also learns from the tokens each round committed (optional: the decoder
    calls ``hindsight`` right after ``observe`` where a schedule has it)."""

    def hindsight(self, proposal: DraftProposal, verified: int, accepted: int, committed: Sequence[int],
                  greedy: bool) -> None:
        """The round's proposal, how many of its tokens were verified and accepted (as ``observe`` had
        them) and the tokens the round committed."""
        ...


@runtime_checkable
class PlainRunSchedule(Protocol):
    """A draft schedule that takes the rounds of a pause in one call (optional: else the decoder tells
    them round by round through ``observe`` and ``hindsight``)."""

    def observe_plain(self, rounds: Sequence[tuple[Sequence[int], float, float]], greedy: bool) -> None:
        """Plain steps run without consulting the schedule (``plain_rounds``), in order: each round's
        committed tokens, draft seconds and verify seconds. Learns what ``observe`` (and ``hindsight``)
        would learn from them told round by round."""
        ...


class DraftBudget:
    """Handed to a drafter while it drafts: calibrated confidence per bucket, and whether one more
    token can still pay (a draft model stops drafting when it can't)."""

    def __init__(self, schedule: AdaptiveSchedule, model: AcceptanceModel) -> None:
        self._schedule, self._model = schedule, model

    def confidence(self, bucket: int, position: int = 0) -> float:
        """Calibrated acceptance of a token in ``bucket`` at ``position`` in its proposal (0: the first)."""
        return self._model.confidence(bucket, position)

    @property
    def min_confidence(self) -> float:
        """Below this, a first token can't lead to a verified run even if every later token were as
        sure: a drafter may skip searching for such tokens (prompt lookup skips short matches)."""
        return self._schedule.min_confidence()

    @property
    def step_seconds(self) -> float | None:
        """What a plain step (the target's one-token pass) costs now, in seconds (None: not known yet): a
        drafter may spend more on its search where steps are long."""
        return self._schedule.verify_cost(1)

    def guess(self, bucket: int, position: int) -> float:
        """How sure the token at ``position`` will be, guessed before drafting it from the token before it
        (in ``bucket``): as sure as a token in that bucket would be there (greedy), or, sampled, as sure
        as the draws are on average there (ScheduleConstants.sampled_mean_guess)."""
        return self._schedule.guess(self._model, bucket, position)

    def keep_drafting(self, drafted: int, reach: float, confidence: float) -> bool:
        """With ``drafted`` tokens so far, all accepted with chance ``reach``, and ``confidence`` the guess
        for the next (``guess``): can drafting more tokens pay?"""
        return self._schedule.worth_drafting(drafted, reach, confidence)


class FixedSchedule:
    """Always draft and verify ``k`` tokens."""

    def __init__(self, k: int) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigError(f"num_draft_tokens={k!r} must be an integer >= 1")
        self.k = k

    def start(self, context: int) -> None:
        return None

    def plain_rounds(self) -> int:
        return 0

    def next_k(self, room: int) -> int:
        return self.k

    def budget(self, greedy: bool) -> DraftBudget | None:
        return None

    def choose(self, proposal: DraftProposal, greedy: bool) -> int:
        return len(proposal.tokens)

    def observe(self, proposal: DraftProposal, verified: int, accepted: int, generated: int, greedy: bool,
                draft_seconds: float, verify_seconds: float, first_matched: bool | float | None = None,
                chances: Sequence[float] | None = None) -> None:
        return None


class AdaptiveSchedule:
    """Verify the prefix of each proposal that maximises ``E(k) − λ·C(k)`` (see the module docs).

    ``target_costs``: the target's measured cost profile (None: learned online, assuming
    linear costs ``T(n) = n·T(1)`` — the worst case on CPUs — until measured).
    ``draft_costs``: the draft model's profile (None: drafting is free, ``free_drafter``,
    or its price is measured on the first rounds that draft). ``priors``: the drafter's prior
    acceptance per bucket for greedy (True) and sampled (False) decoding
    (``DrafterEngine.acceptance_priors``). ``draft_catch_up``: the most committed tokens a
    proposal's first pass takes in (``DrafterEngine.max_catch_up``; None: all), which prices
    a look after plain steps. ``calibrations``: per policy, the pooled calibration of the
    priors to pull the fit towards once this run's outcomes come in (what earlier runs learned:
    calibrations.py; None: the priors as given; see AcceptanceModel). ``draft_scale``: what earlier
    runs' draft proposals cost over the draft profile's price (``DraftPrice.take_scale``; None: start
    at the profile's), ``draft_overhead`` what each cost beyond it (``DraftPrice.take_overhead``; None: nothing
    known). ``calibration_odds``: per policy, the odds the stored calibration's track record
    gives (``calibrations.Stored.odds``; ScheduleConstants.record_odds_bound). ``constants``: the
    schedule's (:class:`ScheduleConstants`; None: the shipped ones). State carries across
    generations on one decoder.
    """

    def __init__(self, k_max: int, *, target_costs: CostProfile | None = None,
                 draft_costs: CostProfile | None = None, free_drafter: bool = False,
                 priors: dict[bool, Sequence[float]] | None = None, draft_catch_up: int | None = MAX_CATCH_UP,
                 calibrations: Mapping[bool, Sequence[float]] | None = None, draft_scale: float | None = None,
                 draft_overhead: float | None = None, calibration_odds: Mapping[bool, float] | None = None,
                 constants: ScheduleConstants | None = None) -> None:
        if not isinstance(k_max, int) or k_max < 1:
            raise ConfigError(f"num_draft_tokens={k_max!r} must be an integer >= 1")
        self.k_max = k_max
        self.c = c = constants or ScheduleConstants()
        self.profile = target_costs
        self.free_drafter = free_drafter
        self._verify = VerifyCosts(target_costs, k_max + 1, window=c.cost_window, refresh_every=c.refresh_costs_every,
                                   refresh_seconds=c.refresh_costs_seconds, bound_by_passes=c.bound_by_passes)
        self.draft_price = DraftPrice(draft_costs, window=c.cost_window, max_catch_up=draft_catch_up,
                                      remembered=draft_scale if c.remember_draft_price else None,
                                      last_logits=c.catch_up_from_prefill, overhead=c.draft_overhead,
                                      remembered_overhead=draft_overhead if c.remember_draft_price else None)
        priors = priors or {}
        self._slot_buckets = {g: not priors.get(g) for g in (True, False)}
        calibrations = calibrations or {}
        # (Prompt lookup keeps even odds: whether an answer copies, as earlier ones did, is the prompt's.)
        odds = {} if free_drafter else {g: min(o, c.record_odds_bound) for g, o in (calibration_odds or {}).items()}
        # (A calibration is of the drafter's priors: without them the slots have nothing to calibrate.)
        self.models = {g: AcceptanceModel(list(priors.get(g) or [c.slot_prior] * k_max), c.prior_strength,
                                          c.recency, calibrations.get(g) if priors.get(g) else None,
                                          early_evidence=c.early_evidence,
                                          weigh_calibration=free_drafter and c.lookup_weighs_remembered,
                                          prior_odds=odds.get(g, 1.0))
                       for g in (True, False)}
        # Decayed counts of which bucket a proposal's first token fell in, from a prior that the
        # drafter's confident buckets are the common ones (drafts are mostly sure of themselves).
        self._first_seen = {g: [0.5 * self.models[g].confidence(b) ** 2 for b in range(len(self.models[g]))]
                            for g in (True, False)}
        self._first_revision = 0  # counts the changes of _first_seen
        # guess's averages per slot group: the confidences averaged (model.confidences), _first_seen's revision
        self._guesses: dict[int, tuple[list[float], int, float]] = {}
        self._rate_tokens = 0.0
        self._rate_seconds = 0.0
        self._plain_rate = 0.0
        self._min_conf: float | None = None
        # Grows to twice the longest pass verified so far. A profile vouches for the sizes it
        # measured (at a short context), so a run with one may start at the largest of them.
        profiled = max(target_costs.seconds) - 1 if target_costs is not None and c.trust_profile_sizes else 0
        self._verify_cap = max(c.first_verify_cap, profiled)
        # Where the profile doesn't vouch for this generation's context (see start), the most a verify
        # pass may hold until one is timed there: None where it vouches; 0 while prompt lookup only looks
        # (ScheduleConstants.look_first), first_verify_cap from its first right look on.
        self._unvouched_cap: int | None = None
        self._start_value: float | None = None  # cached _first_token_value()
        self._potential_cache: float | None = None
        self._first_scale = 1.0  # the first-bucket counts are stored divided by this (lazy decay)
        self._rounds_since_plain = 0
        self._full_streak = 0
        self._longest = 0  # the most drafted tokens one pass verified on this decoder
        self._rounds_since_draft = 0
        self._untaken = 0  # committed tokens a draft model has not taken in: its next proposal's catch-up
        self._context = 0  # committed tokens in this generation's context
        self._probe_interval = c.probe_interval
        self._probing = False  # this round drafts only to look (a costly drafter that doesn't pay)
        self._unaffordable_until = 0.0  # rounds since the last draft before which no look is affordable
        self._look_again = False  # the last look's first token was right
        self._proposals = 0  # proposals drafted in this generation (see observe)
        # The proposal followed in hindsight (see hindsight): its tokens, their buckets and the position
        # of the next one to compare with a committed token (None: none followed).
        self._followed: tuple[Sequence[int], Sequence[int], int] | None = None
        self.guard = GainGuard(window=c.guard_window, min_rounds=c.guard_min_rounds, tolerance=c.guard_tolerance,
                               slack=c.guard_slack, first_pause=c.probe_interval, max_pause=c.guard_max_pause,
                               quiet_rounds=c.guard_quiet_rounds if free_drafter else c.guard_window,
                               quiet_pause=c.guard_quiet_pause if free_drafter else c.probe_interval,
                               quiet_again=c.guard_quiet_again if free_drafter else None,
                               quiet_share=c.guard_quiet_share if free_drafter else 0.0,
                               fresh_after_pause=c.guard_fresh_after_pause and free_drafter,
                               resume_on_gain=c.guard_resume_on_gain)
        self._greedy = True  # the policy of the latest round (what next_k plans for)
        self._budgets = {g: None if self._slot_buckets[g] else DraftBudget(self, self.models[g]) for g in (True, False)}

    def start(self, context: int) -> None:
        # What was learned carries over to the next generation; the cost curve is the profile's at
        # this context (a long prompt makes long passes dearer per token on small models).
        self._verify.at_context(context)
        self._cost_table()  # (refitted now, with the prompt's prefill, rather than in the first round)
        # Past the longest context the profile was measured at, its curve is a guess (a tiny F32 model
        # after 380 tokens: T(5) twice what it says, and a first 4-token bet cost 4 plain steps, 6% of a
        # 64-token answer): the first verify pass holds at most first_verify_cap tokens, and timing it
        # rescales the curve (costfit refits at once when a pass is far off).
        profile = self._verify.profile
        self._unvouched_cap = None
        if profile is not None and not profile.vouches_at(context):
            self._unvouched_cap = 0 if self.free_drafter and self.c.look_first else self.c.first_verify_cap
        self._proposals = 0
        self._followed = None
        self._untaken = 0  # (the drafter's start takes the prompt in)
        self._unaffordable_until = 0.0  # (a look's price was the catch-up on what it now took in)
        self._context = context
        self.draft_price.at_context(context)
        if self.free_drafter:
            self.min_confidence()  # (what prompt lookup's first search asks)

    # -- costs ------------------------------------------------------------------------------
    def verify_cost(self, n: int) -> float | None:
        """Estimated seconds of a target pass over ``n`` tokens (None: nothing known yet)."""
        costs = self._cost_table()
        if not costs:
            return None
        return costs[n - 1] if n <= len(costs) else costs[-1] + (costs[-1] - costs[-2]) * (n - len(costs))

    def _cost_table(self) -> list[float]:
        """T(n) for n = 1 .. k_max + 1, refitted when due (see costfit.VerifyCosts); what depends on it
        is recomputed then."""
        fit = self._verify
        if not fit.stale:
            return fit.table
        costs = fit.refit()
        if costs:
            self._plain_rate = 1.0 / costs[0]
            self._min_conf = self._start_value = self._potential_cache = None
            self._unaffordable_until = 0.0
        return costs

    def busy_profile(self) -> CostProfile | None:
        """The target profile, if this run's steady plain steps ran well under its one-token pass
        (``profile.BUSY_PROFILE``): it was timed in a busy moment (``profile.distrust``); else None."""
        steady, profile = self._verify.steady_seconds(), self.profile
        # (Against the short-context one-token pass, not the curve at this context: a longer context only
        # makes steps dearer, so beating even that says the profile's T(1) was slow.)
        return profile if profile is not None and steady is not None and steady <= BUSY_PROFILE * profile.cost(1) \
            else None

    def switch_cost(self) -> float:
        """Estimated seconds a plain step pays more right after a verify pass (0 before anything is known)."""
        self._cost_table()
        return self._verify.switch

    def min_confidence(self) -> float:
        """The smallest constant per-token confidence at which some run of drafted tokens pays
        (bisection on c; refreshed with the cost table)."""
        costs = self._cost_table()
        if not costs:
            return 1.0
        if self._min_conf is None:
            lam, margin = self.rate(), self.c.margin
            need = [lam * (cost - costs[0]) + margin for cost in costs[1:]]  # gain a run of h must beat
            lo, hi = 0.0, 1.0
            for _ in range(8):  # to within 0.004: plenty for a search threshold
                c = (lo + hi) / 2
                gain, reach, pays = 0.0, 1.0, False
                for bar in need:
                    reach *= c
                    gain += reach
                    if gain > bar + lam * self._verify.switch * (1.0 - reach):  # (from plain steps: see choose)
                        pays = True
                        break
                    if reach < 1e-3:
                        break
                lo, hi = (lo, c) if pays else (c, hi)
            self._min_conf = hi
        return self._min_conf

    def rate(self) -> float:
        """λ: the realized rate (tokens per second), never below plain decoding's."""
        self._cost_table()
        realized = self._rate_tokens / self._rate_seconds if self._rate_seconds > 0 else 0.0
        return max(self._plain_rate, realized)

    # -- decisions --------------------------------------------------------------------------------
    def plain_rounds(self) -> int:
        # The guard's pause, all at once (next_k would answer 0 to each of its rounds); else, for a costly
        # drafter that doesn't pay, the rounds before its next look may come, but not past the refit of
        # the costs that plain steps make due (it could make drafting pay: next_k sees it then, as before).
        paused = self.guard.claim_pause()
        if paused or self.free_drafter or self._look_again or self._start_value is None \
                or self._start_value > self.c.draft_margin:
            return paused
        wait = max(self._probe_interval, self._unaffordable_until) - self._rounds_since_draft
        table = self._verify.table
        claimed = min(int(wait), self._verify.rounds_to_refresh(table[0] if table else 0.0))
        if claimed > 0:
            self._probing = False
        return max(claimed, 0)

    def next_k(self, room: int) -> int:
        self._probing = False
        costs = self._cost_table()
        if not costs:
            return 0  # measure a plain pass first
        if self.profile is None and self._rounds_since_plain >= self.c.plain_refresh:
            return 0  # without a profile, T(1) is only known from plain rounds: refresh it now and then
        if self.guard.paused():
            return 0  # drafting lost to plain steps lately: plain steps for a while
        if self.free_drafter:
            self.guard.asked()
            return self.k_max
        # A costly drafter: draft if looking at one drafted token is worth its price on average;
        # else look now and then (intervals doubling), but only if drafting could pay at all, and
        # while enough of the generation is left for what a look finds to pay back its price.
        # The value is cached until the costs or what a first token looks like change.
        if self._start_value is None:
            self._start_value = self._first_token_value()
        if self._start_value <= self.c.draft_margin and self.c.refit_before_pause and not self._greedy \
                and self.models[False].remembered_unfitted:
            self.models[False].fitted()  # (ScheduleConstants.refit_before_pause)
            self._start_value = self._first_token_value()
            self._potential_cache = None
        if self._start_value > self.c.draft_margin:
            self._probe_interval = self.c.probe_interval
            if self._untaken and not self._earns_back(self._start_value, room, costs[0], self._catch_up_price()):
                return 0
            self.guard.asked()
            return self.k_max
        if not self._look_again and self._rounds_since_draft < max(self._probe_interval, self._unaffordable_until):
            return 0  # no look due yet (or none affordable before then)
        price = self._catch_up_price()  # (a look's price: whether it is affordable and whether it pays back)
        if not (self._look_again or self._probe_affordable(price, costs[0])) \
                or self._potential_value() <= self.c.margin \
                or not self._earns_back(self._potential_value(), room, costs[0], price):  # (the value is cached)
            return 0
        self._probe_interval = min(2 * self._probe_interval, self.c.max_probe_interval)
        self._probing = True
        self.guard.asked()
        return self.k_max

    def _catch_up_price(self) -> float | None:
        """Seconds for the draft to take in the committed tokens it has not seen and draft one (None: unknown)."""
        return self.draft_price.catch_up(self._untaken, self._context)

    def _earns_back(self, value: float, room: int, plain_step: float, price: float | None) -> bool:
        """Whether drafting that gains ``value`` tokens a round (each round giving about 1 + value) over
        the ``room`` left pays for the draft catching up first on the tokens committed since it last
        drafted. After a stretch of plain steps that catch-up is far above a round's price: a small
        Q8_0 draft took 9 ms, 11 plain steps, for 57 tokens after a 380-token prompt. Drafting that came
        to pay (the costs refitted at a long context) with 6 rounds left ran a 64-token answer at 0.86x
        plain; a look in such an answer's last rounds cost it 14%. A look is judged by what drafting
        could gain if every drafted token were accepted, drafting by its expected value. ``price``: that
        catch-up's (``_catch_up_price``)."""
        if price is None:
            return True  # (unknown: drafting tells)
        return value * room / (1.0 + value) >= price / plain_step

    def _probe_affordable(self, price: float | None, plain_step: float) -> bool:
        """Whether a look whose ``price`` is the draft catching up on the tokens it has not taken in
        (``_catch_up_price``) costs at most ``probe_share`` of the plain rounds since the last one."""
        since = self._rounds_since_draft
        if price is None or price <= self.c.probe_share * since * plain_step:
            return True  # (unknown: looking tells)
        # A look's price never falls as more rounds wait: none is affordable before this many (until
        # the prices are refitted), so the rounds until then skip the price (a tiny model's round: ~1%).
        self._unaffordable_until = price / (self.c.probe_share * plain_step)
        return False

    def _potential_value(self) -> float:
        """``_potential()``, cached like the start value."""
        if self._potential_cache is None:
            self._potential_cache = self._potential()
        return self._potential_cache

    def _potential(self) -> float:
        """What drafting could gain per round if every drafted token were accepted (in tokens)."""
        d = self.draft_price.per_token
        if d is None:
            return 1.0  # unknown price: worth finding out
        lam, costs, start = self.rate(), self._cost_table(), self.draft_price.start
        return max(h - lam * (costs[h] - costs[0] + start + d * h) for h in range(1, self.k_max + 1))

    def _first_token_value(self) -> float:
        """Expected gain of drafting one token and then deciding, minus its price (in tokens).

        Averages, over how often each bucket came first (with a prior as pseudo-counts),
        the best that verifying a run of such tokens could gain.
        """
        d = self.draft_price.per_token
        if d is None:
            return -1.0  # unknown price: only looks draft until it is measured
        lam, costs, switch = self.rate(), self._cost_table(), self._verify.switch
        model = self.models[self._greedy]
        weights = self._first_seen[self._greedy]
        total = sum(weights)
        price = self.draft_price.start + d  # drafting the first token (paid whatever is verified)
        deepest = min(self.k_max, max(self.c.lookahead, self._longest if self.c.start_to_longest else 0))
        # (This runs every round a costly drafter drafted: what the buckets share is computed once.)
        extra_at = [costs[h] - costs[0] + switch + d * (h - 1) for h in range(1, deepest + 1)]
        step, plain_rate = costs[0], 1.0 / costs[0]
        cap = self.c.start_rate_cap and lam > plain_rate  # (else it can't bind: the rate is at least plain's)
        # (Plain loops over floats: this runs every round a costly drafter drafted, ~9 buckets x 8 tokens.)
        levels = [model.confidences(h) for h in range(len(extra_at))]
        value = 0.0
        for bucket, w in enumerate(weights):
            if w <= 0:
                continue
            gains, extras = [], []  # tokens over a plain step's, seconds more, of verifying h = 1, 2, ... such tokens
            gain, reach = 0.0, 1.0
            offers = plain_rate  # the best rate such a round offers
            for level, extra in zip(levels, extra_at):
                reach *= level[bucket]
                gain += reach
                extra -= switch * reach
                gains.append(gain)
                extras.append(extra)
                if cap:
                    rate = (1.0 + gain) / (step + extra + price)
                    if rate > offers:
                        offers = rate
                if reach < 0.02:
                    break  # (later tokens add less than 2% of a token each)
            # As in choose, time is worth no more than the best such a round offers: a lucky streak lifts
            # the realized rate above it, and every costly option then looks worse than plain steps.
            rate = offers if cap and offers < lam else lam
            best = 0.0
            for gain, extra in zip(gains, extras):
                net = gain - rate * extra
                if net > best:
                    best = net
            value += w / total * (best - rate * price)
        return value

    def budget(self, greedy: bool) -> DraftBudget | None:
        # None without drafter priors: its buckets mean nothing here; estimate per slot instead.
        return self._budgets[greedy]

    def guess(self, model: AcceptanceModel, bucket: int, position: int) -> float:
        """DraftBudget.guess for ``model`` (one of ``self.models``). The draws' average weighs each bucket
        by how often proposals' first tokens fell in it (the decayed counts the start decision reads)."""
        if not (self.c.sampled_mean_guess and model is self.models[False]):
            return model.confidence(bucket, position)
        weights = self._first_seen[False]
        total = sum(weights)
        if total <= 0.0:
            return model.confidence(bucket, position)
        # (Asked for every token drawn, right after a draft pass; the average moves only when a round
        # teaches the model or the counts: model.confidences hands back the same list until then.)
        levels, group = model.confidences(position), slot_group(position)
        kept = self._guesses.get(group)
        if kept is None or kept[0] is not levels or kept[1] != self._first_revision:
            kept = self._guesses[group] = (levels, self._first_revision,
                                           sum(w * c for w, c in zip(weights, levels)) / total)
        return kept[2]

    def worth_drafting(self, drafted: int, reach: float, confidence: float) -> bool:
        """Can drafting up to ``lookahead`` more tokens, each accepted with ``confidence``, pay for
        drafting them and for the longer verify pass?"""
        costs = self._cost_table()
        if not costs or drafted >= min(self.k_max, self._pass_limit(costs)):
            return False  # (choose would not verify more: in sampled decoding a drawn proposal is verified whole)
        lam = self.rate()
        per_token = self.draft_price.per_token or 0.0
        base = costs[drafted]
        gain = 0.0
        for h in range(1, min(self.c.lookahead, self.k_max - drafted) + 1):
            reach *= confidence
            gain += reach
            if gain - lam * (costs[drafted + h] - base + per_token * h) > self.c.margin:
                return True
        return False

    def choose(self, proposal: DraftProposal, greedy: bool) -> int:
        tokens = proposal.tokens
        costs = self._cost_table()
        cap = self._cap()
        if not tokens or not costs or not cap:
            return 0
        model = self.models[greedy]
        buckets = proposal.buckets if proposal.buckets is not None and not self._slot_buckets[greedy] \
            else range(len(tokens))
        lam = self.rate()
        longest = min(len(tokens), self._pass_limit(costs))
        # Time is worth no more than the best this proposal offers (its expected tokens per second):
        # declining teaches nothing, so the same copy would be declined again while the rate of one
        # that ended decays; at the end of a generation (proposals are cut to the room left) no
        # later round can use the time saved.
        chain = []  # (expected tokens, chance all so far accepted) of verifying j = 1, 2, ... tokens
        expected, reach = 1.0, 1.0
        for j, bucket in enumerate(buckets[:longest]):
            reach *= model.confidence(bucket, j)
            expected += reach
            chain.append((expected, reach))
        # After a plain step, a verify pass makes the next plain step pay the switch, unless all its
        # tokens are accepted and the drafter drafts on (not a probe): the switch is then the later
        # rounds' to pay (one per run of verify passes). After a verify pass the next plain step
        # pays it anyway.
        entry = self._verify.switch if self._verify.after_plain else 0.0
        goes_on = 0.0 if self._probing else 1.0
        lam = min(lam, max([1.0 / costs[0]] + [e / (costs[j] + entry * (1.0 - goes_on * r))
                                               for j, (e, r) in enumerate(chain, start=1)]))
        plain = 1.0 - lam * costs[0] + self.c.margin
        best_k, best = 0, plain
        capped_k, capped, at_cap = 0, plain, plain
        for j, (expected, reach) in enumerate(chain, start=1):
            value = expected - lam * (costs[j] + entry * (1.0 - goes_on * reach))
            improved = value > best
            if improved:
                best_k, best = j, value
            if j <= cap:
                if value > capped:
                    capped_k, capped = j, value
                if j == cap:
                    at_cap = value
            if not improved and reach < 0.02:
                break  # later tokens add less than 2% of a token each
        if best_k <= cap:
            return self._first_of_two(chain, costs, lam, entry, best_k) \
                if self.free_drafter and self.c.split_passes and best_k > 1 else best_k
        # (Exploring) a longer pass looks best, but a profile measured at a short context can be far
        # off at a long one (small models) and one long wrong pass costs many tokens: go as long as
        # the cap allows (it doubles with each such pass) while that still beats a plain step.
        return cap if at_cap > plain else capped_k

    def _cap(self) -> int:
        """The verify cap now: it grows as passes at it are all accepted (see observe)."""
        return self._verify_cap if self._unvouched_cap is None else min(self._verify_cap, self._unvouched_cap)

    def _pass_limit(self, costs: Sequence[float]) -> int:
        """The most tokens ``choose`` may verify in one pass now: the cap, or past it (exploring) after
        a streak of passes at it all accepted (see choose), within the cost table."""
        cap = self._cap()
        if not cap:
            return 0
        exploring = self._full_streak >= self.c.explore_streak
        return len(costs) - 1 if exploring else min(len(costs) - 1, cap)

    def _first_of_two(self, chain: Sequence[tuple[float, float]], costs: Sequence[float], lam: float,
                      entry: float, k: int) -> int:
        """How many of the ``k`` drafted tokens one pass should verify, where a second pass may verify
        the rest next round: prompt lookup proposes the rest of a copy again for nothing once the first
        part is kept. On a steep curve (exact kernels at 1 thread: a 15-token pass costs 10 one-token
        passes, an 8-token one 5.8) two passes of 7 cost little more than one of 14, and one lost bet
        loses far less. ``chain``: (expected tokens, chance all accepted) of verifying j = 1, 2, ...
        tokens (as choose); ``entry``: the switch a verify pass makes the next plain step pay (a free drafter
        drafts on after a fully accepted pass: then the next pass pays it)."""
        n, margin = len(chain), self.c.margin
        expected = [1.0] + [e for e, _ in chain]  # expected[j] - 1: the chance-weighted tokens of the first j
        reach = [1.0] + [r for _, r in chain]
        priced = [lam * cost for cost in costs[:k + 1]]
        stride = max(1, k // 12)  # (at most ~13 x 13 pairs: this runs in the decode loop)
        best_j, best = k, 0.0
        for j in range(k, 0, -stride):  # (k first)
            r = reach[j]
            value = expected[j] - priced[j] - lam * entry * (1.0 - r)
            # The rest is proposed again once all j are kept and the target's own next token is the
            # proposal's (j + 1)th: a second pass starts s tokens in. The rounds after it are alike
            # either way, so it counts as its own E - λ·C where that beats the margin (else the round
            # is one that would have come anyway); its switch is the first pass's.
            s = j + 1
            if s < n and reach[s] > 0.0:
                base, scale, later = expected[s], 1.0 / reach[s], margin
                top = min(k, n - s)
                for m in range(top, 0, -stride):
                    v = 1.0 + (expected[s + m] - base) * scale - priced[m]
                    if v > later:
                        later = v
                value += reach[s] * (later - margin)
            if j == k:
                best = value + margin  # (two passes must gain more: a round more, whose overhead no curve counts)
            elif value > best:
                best_j, best = j, value
        return best_j

    def learned(self, at_least: Mapping[bool, int] | None = None) -> dict[bool, tuple[tuple[float, float, float, float], int]]:
        """Per policy whose drafter has buckets (and, given ``at_least``, whose outcomes reach it: the
        others are not refitted, ~50 us each): the pooled calibration this run's outcomes say on their own
        (fitted around the drafter's priors as given, not the remembered calibration: see
        AcceptanceModel.own_fit) and how many outcomes taught it (what calibrations.py keeps for the next run)."""
        at_least = at_least or {}
        return {g: (m.own_fit(), m.outcomes) for g, m in self.models.items()
                if not self._slot_buckets[g] and m.outcomes >= at_least.get(g, 0)}

    def counts(self) -> dict[bool, tuple[tuple[list[float], list[float]], tuple[float, ...]]]:
        """Per policy whose drafter has buckets, a costly drafter's (a draft model's): the per-slot outcomes
        its calibration is fitted to (AcceptanceModel.counts) and the drafter's priors, what calibrations.py
        keeps pending of a run too short to teach a calibration alone. (A free drafter's looks cost nothing,
        so no run of it is blind for want of them: prompt lookup passes on only what a run learned.)"""
        if self.free_drafter:
            return {}
        return {g: (m.counts(), m.priors) for g, m in self.models.items() if not self._slot_buckets[g]}

    # -- learning -----------------------------------------------------------------------------------
    def _right_look(self, first_matched: bool | float | None) -> bool:
        """Whether a declined proposal's first token was right (see observe): greedy, the plain step's own
        token; sampled, a chance of acceptance at which drafted runs could pay (min_confidence)."""
        if isinstance(first_matched, float):
            return first_matched >= self.min_confidence()
        return bool(first_matched)

    def _teaches_unverified(self, model: AcceptanceModel, bucket: int) -> bool:
        """Whether a declined prompt-lookup proposal starting in ``bucket`` is near enough what may be
        verified for its unverified outcomes to teach the calibration (ScheduleConstants.unverified_band)."""
        return model.confidence(bucket) >= self.min_confidence() - self.c.unverified_band

    def hindsight(self, proposal: DraftProposal, verified: int, accepted: int, committed: Sequence[int],
                  greedy: bool) -> None:
        """Greedy prompt lookup: follow a proposal's tokens that were not verified against the tokens the
        target commits (``committed``: this round's, called after ``observe``), round after round up to the
        first that differs; those that plain steps commit teach the calibration as verifying them would
        have (ScheduleConstants.hindsight_weight). One proposal at a time, so a committed token teaches each
        slot group at most once, and a verified round's tokens only their own slots."""
        weight = self.c.hindsight_weight
        if not (greedy and self.free_drafter and weight > 0.0) or self._slot_buckets[True]:
            return
        model = self.models[True]
        if self._followed is not None:
            tokens, buckets, at = self._followed
            seen = []
            for token in committed:
                hit = tokens[at] == token
                if not verified:
                    seen.append((buckets[at], hit, at))
                at += 1
                if not hit or at == len(tokens):
                    at = len(tokens)
                    break
            if seen:
                model.update_hindsight(seen, weight)
            self._followed = (tokens, buckets, at) if at < len(tokens) else None
            if self._followed is not None:
                return
        drafted, buckets = proposal.tokens, proposal.buckets
        if buckets is None or accepted < verified or len(drafted) <= verified + 1 or len(committed) <= verified \
                or drafted[verified] != committed[verified]:
            return  # (nothing left to follow, or it already differs: a rejection, a wrong look, a wrong bonus)
        if not verified and not self._teaches_unverified(model, buckets[0]):
            return  # (a declined short match: its outcomes would drag the long ones down)
        self._followed = (drafted, buckets, verified + 1)

    def observe(self, proposal: DraftProposal, verified: int, accepted: int, generated: int, greedy: bool,
                draft_seconds: float, verify_seconds: float, first_matched: bool | float | None = None,
                chances: Sequence[float] | None = None) -> None:
        seconds = draft_seconds + verify_seconds
        after_verify = self._verify.after_verify
        self._verify.record(verified + 1, verify_seconds, seconds)
        if verified:
            self._verify_cap = max(self._verify_cap, 2 * verified)
            self._longest = max(self._longest, verified)
            self._unvouched_cap = None  # (timed at this context now)
            self._full_streak = self._full_streak + 1 if accepted == verified else 0
        elif self._unvouched_cap == 0 and self._right_look(first_matched):
            self._unvouched_cap = self.c.first_verify_cap
        self._greedy = greedy
        weight = self.c.rate_smoothing
        self._rate_tokens += weight * (generated - self._rate_tokens)
        self._rate_seconds += weight * (seconds - self._rate_seconds)
        self._rounds_since_plain = 0 if verified == 0 else self._rounds_since_plain + 1
        context, untaken = self._context, self._untaken  # (what the proposal's draft passes attended to)
        self._context += generated
        drafted = len(proposal.tokens)
        self.guard.record(verified, generated, draft_seconds, verify_seconds, after_verify=after_verify)
        # A look whose first token was right looks again next round, though drafting doesn't pay on
        # average yet: a run of right looks is how a draft whose own probabilities undersell it earns
        # trust. After a wrong one the wait goes on doubling as before. Sampled, "right" is a chance of
        # acceptance at which drafted runs could pay (min_confidence): looks whose tokens had lesser
        # chances repeated round after round where drafting can't pay (a tiny F32 pair: 0.97x -> 0.945x).
        self._look_again = self._probing and (accepted > 0 or self._right_look(first_matched))
        if drafted == 0:
            self._rounds_since_draft += 1
            self._untaken += generated
            return
        self._rounds_since_draft = self._untaken = 0
        self._start_value = self._potential_cache = None  # drafted: price and first tokens moved
        self._unaffordable_until = 0.0
        if not self.free_drafter and draft_seconds > 0:
            self.draft_price.record(drafted, draft_seconds, cold=self._proposals < self.c.cold_proposals,
                                    context=context, untaken=untaken)
        self._proposals += 1
        buckets = proposal.buckets if proposal.buckets is not None and not self._slot_buckets[greedy] \
            else range(drafted)
        if not self.free_drafter:  # only a costly drafter's start decision reads these counts
            seen = self._first_seen[greedy]
            if buckets[0] < len(seen):
                self._first_revision += 1
                self._first_scale /= self.c.first_bucket_decay  # decay all counts at once
                seen[buckets[0]] += self._first_scale
                if self._first_scale > 1e6:  # renormalise before the numbers grow large
                    for g in (True, False):
                        self._first_seen[g] = [x / self._first_scale for x in self._first_seen[g]]
                    self._first_scale = 1.0
        if verified and chances and self.c.sampled_chances:
            self.models[greedy].update_chances(list(buckets[:len(chances)]), chances)
        elif verified:
            self.models[greedy].update(list(buckets[:verified]), accepted)
        elif first_matched is not None and (not self.free_drafter
                                            or self._teaches_unverified(self.models[greedy], buckets[0])):
            # Free evidence, for the calibration only: a draft whose buckets say "don't verify" (a
            # random-weight draft is right 80% of the time at 0.05-0.3 probability) is otherwise
            # never verified, so never learns it could be. For prompt lookup only buckets
            # near what may be verified count: its declined short matches (mostly wrong) dragged its
            # long ones down with them (Gemma at 1 thread: 1.2x -> 1.0x plain), while on a steep curve
            # (Gemma at 1 thread needs 0.91, a 23-token match starts at 0.9) its long matches would
            # otherwise never be verified. Sampled, the evidence is the chance the token would have
            # been accepted (without it a sampled run with such a draft hardly drafted: tiny-wide
            # 1.10x plain where k = 4 reaches 1.43x).
            self.models[greedy].update_calibration(buckets[0], first_matched)

    def observe_plain(self, rounds: Sequence[tuple[Sequence[int], float, float]], greedy: bool) -> None:
        """PlainRunSchedule.observe_plain: ``observe`` and ``hindsight`` of a plain step for each round, in
        one loop where a plain step follows a plain step and no proposal is followed in hindsight (a 63-round
        pause: 19 us warm, against 71 told round by round; this runs right after a pass, with cold caches)."""
        at = 0
        while at < len(rounds) and (not self._verify.after_plain or self._followed is not None):
            committed, draft_seconds, verify_seconds = rounds[at]  # (a switch to charge, or tokens to follow)
            self.observe(NO_PROPOSAL, 0, 0, len(committed), greedy, draft_seconds, verify_seconds)
            self.hindsight(NO_PROPOSAL, 0, 0, committed, greedy)
            at += 1
        rest = rounds[at:]
        if not rest:
            return
        committed, drafting, verifying = zip(*rest)
        rounds_seconds = list(map(add, drafting, verifying))
        counts = list(map(len, committed))
        generated = sum(counts)
        weight = self.c.rate_smoothing
        tokens, seconds = self._rate_tokens, self._rate_seconds
        for count, round_seconds in zip(counts, rounds_seconds):
            tokens += weight * (count - tokens)
            seconds += weight * (round_seconds - seconds)
        self._rate_tokens, self._rate_seconds = tokens, seconds
        self._verify.record_plain_steps(verifying, rounds_seconds)
        self.guard.record_plain_steps(drafting, verifying)
        self._greedy = greedy
        self._rounds_since_plain = 0
        self._context += generated
        self._look_again = False
        self._rounds_since_draft += len(rest)
        self._untaken += generated
