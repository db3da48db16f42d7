"""Draft policies on a virtual clock: traces, cost curves and one-call simulated runs.

Used by tests/test_schedule.py (the schedule never loses to plain decoding on any curve)
and benchmarks/policy_sim.py (the full matrix, plus recorded traces). A run is greedy
and exact: the simulated target's output is the trace, whatever the policy drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

from .calibrations import Calibration, Counts, Stored, passed_on, pending_of, tested_of, worth_keeping
from .decoder import SpeculativeDecoder
from .drafters import AutoregressiveDrafter, PromptLookupDrafter
from .drafters.autoregressive import _top_probability
from .engine import SpeculativeEngine
from .engines.simulated import SimulatedDraftEngine, TraceEngine, VirtualClock
from .profile import CALIBRATION_SIZES, CostProfile
from .schedule import AdaptiveSchedule, DraftSchedule, ScheduleConstants
from .settings import default_num_draft_tokens

# Cost curves (seconds of a one-token pass, T(n)/T(1), and what a one-token pass after one of
# another size costs more, as a share of T(1)) measured on CPUs (docs/performance.md, issue 10)
# and a GPU-like one where verifying more tokens is nearly free.
CURVES: dict[str, tuple[float, dict[int, float], float]] = {
    "gemma-epyc": (13e-3, {1: 1, 2: 1.87, 3: 2.11, 5: 3.59, 9: 4.57, 17: 6.92}, 0.07),
    "gemma-epyc-1t": (18e-3, {1: 1, 2: 2.31, 3: 2.79, 5: 4.68, 9: 6.07, 17: 8.5}, 0.03),
    "49k-xeon": (27e-3, {1: 1, 2: 1.49, 3: 2.06, 5: 3.87, 9: 6.21}, 0.05),
    "tiny-f32": (0.24e-3, {1: 1, 2: 1.55, 3: 2.25, 5: 3.24, 9: 5.79}, 0.6),
    "linear": (10e-3, {1: 1, 2: 2, 3: 3, 5: 5, 9: 9}, 0.0),
    "gpu-like": (8e-3, {1: 1, 2: 1.02, 3: 1.04, 5: 1.08, 9: 1.15, 17: 1.3}, 0.02),
    # A target whose passes are dominated by its weights (benchmarks/matrix.py's tiny-big-q8, 2 threads).
    "big-q8": (12.7e-3, {1: 1, 2: 1.17, 3: 1.35, 5: 2.03, 9: 2.68}, 0.013),
}


def curve_profile(name: str) -> CostProfile:
    base, ratios, switch = CURVES[name]
    return CostProfile({n: base * r for n, r in ratios.items()}, switch_seconds=base * switch)


def calibrated_profile(name: str) -> CostProfile:
    """What ``specdec calibrate`` measures of curve ``name``: its costs at ``CALIBRATION_SIZES`` only (a
    real run learns the larger sizes' costs online; given them, the schedule's first verify cap
    started past what a real run's does: 16 instead of 8 on gemma-epyc)."""
    whole = curve_profile(name)
    return CostProfile({n: t for n, t in whole.seconds.items() if n in CALIBRATION_SIZES},
                       switch_seconds=whole.switch_seconds)


@dataclass
class Trace:
    """A prompt and the target's greedy output for it.

    ``draft_agree`` / ``draft_confidence``: a real draft model's behaviour, recorded teacher-forced
    over prompt + output (benchmarks/record_traces.py ``--draft``): at each position, whether the
    draft's argmax given everything before it is the trace's token, and the draft's top probability
    there. A simulated draft model replays them instead of a synthetic pattern (None: synthetic).
    """

    id: str
    prompt: list[int]
    output: list[int]
    n_vocab: int
    draft_agree: list[bool] | None = None
    draft_confidence: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt) + len(self.output)
        recorded = (self.draft_agree, self.draft_confidence)
        if (recorded[0] is None) != (recorded[1] is None) or any(r is not None and len(r) != n for r in recorded):
            raise ValueError(f"trace {self.id}: draft_agree and draft_confidence need one entry per position "
                             f"of prompt + output ({n}), both or neither")

    def target(self, costs: CostProfile, clock: VirtualClock) -> TraceEngine:
        """A simulated target whose greedy output is this trace's, its passes costing what ``costs``
        says on ``clock``."""
        return TraceEngine(self.prompt + self.output, self.n_vocab, costs, clock)


def synthetic_traces(seed: int = 0, vocab: int = 4000) -> list[Trace]:
    """Copies with edits, short chat-like answers, a copy with one word renamed everywhere and open text,
    with the phrase reuse real text has."""
    rng = np.random.default_rng(seed)

    def words(n: int) -> list[int]:
        return [int(t) % (vocab - 10) + 10 for t in rng.zipf(1.3, n)]

    def text(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if len(out) > 20 and rng.random() < 0.08:  # now and then repeat an earlier span
                a = int(rng.integers(0, len(out) - 5))
                out += out[a:a + int(rng.integers(3, 8))]
            else:
                out += words(1)
        return out[:n]

    def edited(src: list[int], rate: float) -> list[int]:
        out: list[int] = []
        for t in src:
            r = rng.random()
            if r < rate / 3:
                continue  # a deletion
            if r < 2 * rate / 3:
                out += words(1)  # a substitution
                continue
            out.append(t)
            if r < rate:
                out += words(int(rng.integers(1, 4)))  # an insertion
        return out

    traces = []
    for rate in (0.01, 0.05, 0.15):
        src = text(300)
        traces.append(Trace(f"copy-edit-{rate}", text(20) + src + text(12), edited(src, rate) + text(40), vocab))
    for i in range(3):
        src = text(90)
        answer = {0: edited(src, 0.02)[:70],  # rename / fix a typo: mostly a copy
                  1: text(8) + src[10:40] + text(30),  # quote a part, then explain
                  2: text(80)}[i]  # an open answer
        traces.append(Trace(f"chat-short-{i}", text(25) + src + text(10), answer, vocab))
    src = text(150)
    counts = {t: src.count(t) for t in set(src)}
    old = min((t for t, c in counts.items() if 3 <= c <= 8), key=lambda t: (abs(counts[t] - 5), t))
    renamed = [vocab - 5 if t == old else t for t in src]  # a word of its own, renamed everywhere
    traces.append(Trace("copy-rename", text(20) + src + text(8), renamed + text(40), vocab))
    for i in range(2):
        traces.append(Trace(f"open-{i}", text(30), text(300), vocab))
    return traces


def record_draft(draft: SpeculativeEngine, tokens: Sequence[int], chunk: int = 64) -> tuple[list[bool], list[float]]:
    """A real draft model's behaviour over ``tokens`` (a prompt and the target's greedy output),
    teacher-forced, for ``Trace(draft_agree=, draft_confidence=)``: at each position whether the
    draft's argmax given all before it is the token there, and its top probability (position 0 has
    no context: counted right, at 0.5). ``chunk`` positions a pass; uses and clears the draft's cache."""
    draft.reset(0)
    agree, confidence = [True], [0.5]
    for start in range(0, len(tokens) - 1, chunk):
        rows = draft.forward_logits(tokens[start:min(start + chunk, len(tokens) - 1)])
        for i, row in enumerate(rows, start=start + 1):
            top = int(np.argmax(row))
            agree.append(top == tokens[i])
            confidence.append(_top_probability(row, top))  # (the drafter's own: the same buckets)
    draft.reset(0)
    return agree, confidence


DraftStyle = Literal["informative", "underconfident"]


def draft_pattern(rng: np.random.Generator, n: int, agreement: float,
                  style: DraftStyle = "informative") -> tuple[list[bool], list[float]]:
    """Where a simulated draft agrees with the target, and its confidence: easy and hard stretches.

    ``informative``: a confidence that is informative but noisy (a draft is often sure of itself
    when wrong). ``underconfident``: low and telling nothing, whether right or wrong (a draft with
    random or distilled weights: the matrix's tiny-wide pair, right 85-90% of the time at top
    probabilities of 0.05-0.5), so only the calibration can find out that it pays.
    """
    agree, conf = [], []
    easy = True
    for _ in range(n):
        if rng.random() < 0.1:
            easy = rng.random() < agreement
        a = rng.random() < (0.95 if easy else 0.35)
        agree.append(bool(a))
        if style == "underconfident":
            conf.append(float(np.clip(rng.beta(2, 5), 0.01, 0.999)))
        else:
            conf.append(float(np.clip(rng.beta(8, 2) if a else rng.beta(3, 3), 0.01, 0.999)))
    return agree, conf


@dataclass(frozen=True)
class SimulatedRun:
    """One simulated run: its generation seconds and, for the adaptive schedule, what it learned
    (``AdaptiveSchedule.learned()``: per policy, the pooled calibration and how many outcomes taught it)."""

    seconds: float
    learned: dict[bool, tuple[tuple[float, float, float, float], int]]
    # Per policy, the run's per-slot outcomes and the drafter's priors (AdaptiveSchedule.counts): what a
    # run with too few outcomes to pass on a calibration leaves pending.
    counts: dict[bool, tuple[Counts, tuple[float, ...]]] = field(default_factory=dict)
    # Per policy, how much better the stored calibration the run started from predicted its outcomes than the
    # priors as given (calibrations.tested_of): its verdict for the track record.
    tested: dict[bool, float] = field(default_factory=dict)


def simulate(trace: Trace, curve: str, max_tokens: int, k: int | None, *, drafter: str = "prompt-lookup",
             agreement: float = 0.8, draft_ratio: float = 0.1, draft_style: DraftStyle = "informative",
             seed: int = 0, schedule: DraftSchedule | None = None) -> float:
    """Simulated generation seconds of one cold run on ``trace`` (see :func:`simulate_run`)."""
    return simulate_run(trace, curve, max_tokens, k, drafter=drafter, agreement=agreement, draft_ratio=draft_ratio,
                        draft_style=draft_style, seed=seed, schedule=schedule).seconds


def simulate_run(trace: Trace, curve: str, max_tokens: int, k: int | None, *, drafter: str = "prompt-lookup",
                 agreement: float = 0.8, draft_ratio: float = 0.1, draft_style: DraftStyle = "informative",
                 seed: int = 0, schedule: DraftSchedule | None = None,
                 calibrations: Mapping[bool, Sequence[float]] | None = None, stored: Stored | None = None,
                 constants: ScheduleConstants | None = None,
                 schedule_type: type[AdaptiveSchedule] = AdaptiveSchedule, draft_overhead: float = 0.0) -> SimulatedRun:
    """One run on ``trace`` with a fresh decoder.

    ``k`` None: the adaptive schedule (or ``schedule``, if given); 0: plain decoding; else fixed k.
    ``drafter`` "draft-model" simulates a draft costing ``draft_ratio`` of a target pass per token
    that replays the trace's recorded draft, or (without one) agrees with the target ``agreement``
    of the time in easy stretches with confidences of ``draft_style`` (see :func:`draft_pattern`), each
    proposal ``draft_overhead`` of a target pass more (SimulatedDraftEngine's ``overhead``).
    ``calibrations``: the calibrations earlier runs left in the store (calibrations.py), which the
    adaptive schedule pulls its fit towards, as ``specdec run`` does after earlier runs with the same
    models. ``stored``: all the store holds (its calibrations and their track record), in place of
    ``calibrations``. ``constants``: the adaptive schedule's (None: the shipped ones). ``schedule_type``: the
    adaptive schedule's class (a subclass that logs its rounds: benchmarks/round_log.py).
    """
    odds = None
    if stored is not None:
        calibrations, odds = stored.calibrations, stored.calibration_odds()
    costs = curve_profile(curve)
    clock = VirtualClock()
    full = trace.prompt + trace.output
    target = trace.target(costs, clock)
    draft_costs = None
    if drafter == "prompt-lookup":
        drafting = PromptLookupDrafter()
    else:
        if trace.draft_agree is not None and trace.draft_confidence is not None:
            agree, conf = trace.draft_agree, trace.draft_confidence  # (a recorded draft: replayed)
        else:
            agree, conf = draft_pattern(np.random.default_rng(seed), len(full), agreement, draft_style)
        base = costs.cost(1)
        draft_costs = CostProfile({1: base * draft_ratio, 2: base * draft_ratio * 1.2})
        drafting = AutoregressiveDrafter(SimulatedDraftEngine(full, agree, conf, trace.n_vocab, draft_costs, clock,
                                                              overhead=base * draft_overhead))
    if k == 0:
        decoder = SpeculativeDecoder(target, clock=clock)
    elif k is None:
        schedule = schedule or schedule_type(
            default_num_draft_tokens(drafter, True), target_costs=calibrated_profile(curve), draft_costs=draft_costs,
            free_drafter=drafter == "prompt-lookup", draft_catch_up=drafting.max_catch_up,
            priors={g: drafting.acceptance_priors(g) for g in (True, False)}, calibrations=calibrations,
            calibration_odds=odds, constants=constants)
        decoder = SpeculativeDecoder(target, drafting, schedule=schedule, clock=clock)
    else:
        decoder = SpeculativeDecoder(target, drafting, num_draft_tokens=k, adaptive=False, clock=clock)
    n = min(max_tokens, len(trace.output))
    result = decoder.generate(trace.prompt, n, ignore_eog=True)
    if result.tokens != trace.output[:n]:
        raise AssertionError(f"simulation of {trace.id} broke greedy exactness")
    if k is None and isinstance(schedule, AdaptiveSchedule):
        counts = schedule.counts()
        return SimulatedRun(result.stats.generation_seconds, schedule.learned(), counts,
                            tested_of(schedule.models, counts))
    return SimulatedRun(result.stats.generation_seconds, {})


def remembered(runs: Sequence[SimulatedRun]) -> dict[bool, Calibration]:
    """The calibrations the user cache would hold after ``runs``, in order: each run that learned from
    at least ``MIN_OBSERVATIONS`` outcomes moves them half way (calibrations.blend), as a decoder's
    remember step does; runs with fewer leave their outcomes pending: calibrations.passed_on)."""
    stored = Stored()
    for run in runs:
        stored = _kept(stored, run)
    return stored.calibrations


def in_turn(traces: Sequence[Trace], run: Callable[[Trace, Stored], SimulatedRun],
            turns: int = 2) -> dict[str, SimulatedRun]:
    """Per trace, its run in the last of ``turns`` turns over ``traces``, each run (``run(trace,
    stored)``) starting from what every run before it left in the store, as a user's cache
    evolves: a calibration taught by earlier runs that were themselves remembered is taken on a prompt
    unlike theirs (what :func:`remembered` over cold runs can't show)."""
    stored = Stored()
    last: dict[str, SimulatedRun] = {}
    for _ in range(turns):
        for trace in traces:
            last[trace.id] = result = run(trace, stored)
            stored = _kept(stored, result)
    return last


def _kept(stored: Stored, run: SimulatedRun) -> Stored:
    """``stored`` after ``run`` remembered what it learned (the same rules as SpeculativeDecoder._remember
    and calibrations.remember)."""
    keep = worth_keeping(run.learned)
    return passed_on(stored, {greedy: cal for greedy, (cal, _) in keep.items()}, pending_of(keep, run.counts),
                     tested=run.tested)
