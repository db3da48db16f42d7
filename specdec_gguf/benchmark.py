"""Benchmarks: plain vs speculative strategies on the same loaded models, interleaved, with repeats.

Speed lives here, never in unit tests. Trials are *cold* by default: a fresh decoder per
trial, as `specdec run` starts (only the cached cost profile is known), so short answers
count the price of learning. ``cold=False`` keeps one decoder per strategy across trials.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from .decoder import SpeculativeDecoder
from .engine import SpeculativeEngine, TextModel
from .factory import make_decoder
from .sampling import SamplingParams
from .schedule import ScheduleConstants
from .settings import DrafterSettings


@dataclass(frozen=True)
class Strategy:
    """One way of generating, named for the report. ``peer`` strategies run another implementation."""

    name: str
    drafter: DrafterSettings
    peer: bool = False
    constants: ScheduleConstants | None = None  # the adaptive schedule's (None: the shipped ones)
    remember: bool = True  # read and write the calibrations earlier runs left (calibrations.py)

    @property
    def is_plain(self) -> bool:
        return self.drafter.kind == "none" and not self.peer

    @property
    def is_fixed(self) -> bool:
        return not self.peer and self.drafter.kind != "none" and not self.drafter.adaptive


@dataclass(frozen=True)
class Trial:
    strategy: str
    prompt_id: str
    repeat: int
    throughput: float  # generation tok/s
    acceptance_rate: float
    tokens_per_target_pass: float
    draft_per_token: float  # seconds per drafted token
    tokens: tuple[int, ...]
    python_share: float | None = None  # share of generation time outside llama_decode
    declined: int = 0  # rounds whose proposal was verified not at all (SpecStats.declined)
    draft_share: float = 0.0  # share of generation time spent drafting (SpecStats.draft_seconds)
    passes_by_verified: tuple[int, ...] = ()  # SpecStats.passes_by_verified
    # The answer's time in its own plain steps (generation_seconds / SpecStats.plain_step): what the host's
    # speed at that moment does not move (None: fewer than MIN_PLAIN_STEPS plain steps to price one by).
    in_plain_steps: float | None = None


# Plain steps a trial needs for its time to be counted in them (see Trial.in_plain_steps).
MIN_PLAIN_STEPS = 8


@dataclass
class StrategyReport:
    name: str
    median_throughput: float
    speedup: float  # geometric mean over prompts of median(strategy) / median(plain)
    acceptance_rate: float
    tokens_per_target_pass: float
    per_prompt_speedup: dict[str, float] = field(default_factory=dict)
    # Per prompt, the median over repeats of each trial's throughput over the plain trial of the same prompt
    # and repeat (seconds apart: a host whose speed drifts over minutes moves both alike), and their geomean.
    per_prompt_paired: dict[str, float] = field(default_factory=dict)
    paired_speedup: float | None = None
    # The lowest and highest over repeats of one repeat's paired ratios' geomean over prompts: how far the
    # figure moves between repeats on this host (a second plain arm's spread is the noise alone).
    paired_spread: tuple[float, float] | None = None
    # Per prompt, the median over repeats of the plain trial's time in its own plain steps over this trial's
    # (Trial.in_plain_steps), and their geomean: a ratio that drift of the host's speed between two trials
    # does not move, but that misses anything making the target's own steps slower (a draft model evicting
    # its weights from the caches). Where the strategy drafts little, it shows what drafting cost.
    per_prompt_in_steps: dict[str, float] = field(default_factory=dict)
    paired_in_steps: float | None = None
    # adaptive only: median throughput / the best fixed k of the same drafter, per prompt and geomean
    vs_best_fixed: dict[str, float] = field(default_factory=dict)
    vs_best_fixed_geomean: float | None = None
    greedy_match: float | None = None  # share of prompts whose output equals plain decoding's (greedy runs)
    # our strategies in greedy runs: per prompt, whether every trial's output equals plain decoding's
    same_output: dict[str, bool] = field(default_factory=dict)
    python_share: float | None = None  # median share of generation time outside llama_decode
    declined: float = 0.0  # median rounds per answer whose proposal was verified not at all
    draft_share: float = 0.0  # median share of generation time spent drafting
    # Mean target passes per answer by how many drafted tokens each verified (item 0: plain steps)
    passes_by_verified: list[float] = field(default_factory=list)
    peer: bool = False  # another implementation (no acceptance figures of ours)
    plain: bool = False  # plain decoding (the first such report is the one every ratio is over)


def measure_cost_curve(target: TextModel, context: Sequence[int], sizes: Sequence[int],
                       repeats: int = 5) -> dict[int, float]:
    """Median seconds of one target pass over n tokens after ``context``, for each n in ``sizes``."""
    base = list(context[:-1])
    target.reset(0)
    target.advance(base)
    curve = {}
    for n in sizes:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            target.forward_argmax([context[-1]] * n)
            times.append(time.perf_counter() - t0)
            target.reset(len(base))
        curve[n] = statistics.median(times)
    target.reset(0)
    return curve


def run_trials(target: TextModel, draft: TextModel | None, strategies: Sequence[Strategy],
               prompts: Sequence[tuple[str, list[int]]], max_tokens: int, repeats: int,
               sampling: SamplingParams = SamplingParams(), *, cold: bool = True, profile_cache: bool = True,
               on_trial: Callable[[Trial], None] | None = None) -> list[Trial]:
    """Every (non-peer) strategy on every prompt, interleaved (A B C A B C ...), after a warm-up.

    End-of-generation tokens are ignored so every trial generates ``max_tokens`` tokens.
    ``cold``: a fresh decoder per trial that prefills its prompt, as ``specdec run`` starts; with
    ``profile_cache`` it reads the cached cost profiles and remembered calibrations (as a user's
    later runs do), without, it measures and learns afresh. Seeded ``sampling`` samples repeat r with
    ``seed + r``: every strategy of a repeat starts from the same generator state, and each repeat draws
    another answer (a sampled answer's speed is as much its draws' luck as its strategy's: one answer
    timed over and over averages the timing, not the luck).
    """
    ours = [s for s in strategies if not s.peer]

    def decoder_for(s: Strategy) -> SpeculativeDecoder:
        return make_decoder(target, s.drafter, draft, profile_cache=profile_cache, remember=s.remember,
                            constants=s.constants)

    decoders = {s.name: decoder_for(s) for s in ours}  # also caches cost profiles
    make_decoder(target, DrafterSettings(kind="none")).generate(prompts[0][1], min(32, max_tokens), sampling,
                                                                ignore_eog=True)  # warm llama.cpp up
    if not cold:
        for s in ours:
            decoders[s.name].generate(prompts[0][1], min(16, max_tokens), sampling, ignore_eog=True)
    trials = []
    engines = [e for e in (target, draft) if e is not None]
    for rep in range(repeats):
        drawn = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + rep)
        for prompt_id, tokens in prompts:
            for s in ours:
                decoder = decoder_for(s) if cold else decoders[s.name]
                if cold:
                    start_afresh(engines)
                decode_before = sum(e.decode_seconds for e in engines)
                r = decoder.generate(tokens, max_tokens, drawn, ignore_eog=True)
                st = r.stats
                # The prefill's decode time is not part of generation: subtract its share of this run.
                decoded = sum(e.decode_seconds for e in engines) - decode_before
                in_llama = decoded - st.prefill_seconds
                share = 1.0 - in_llama / st.generation_seconds if st.generation_seconds and decoded else None
                passes = st.passes_by_verified
                step = st.plain_step if passes[0] >= MIN_PLAIN_STEPS else None
                trial = Trial(s.name, prompt_id, rep, st.generation_throughput, st.acceptance_rate,
                              st.tokens_per_target_pass, st.draft_seconds / st.drafted if st.drafted else 0.0,
                              tuple(r.tokens), share, st.declined,
                              st.draft_seconds / st.generation_seconds if st.generation_seconds else 0.0,
                              tuple(passes), st.generation_seconds / step if step else None)
                trials.append(trial)
                if on_trial:
                    on_trial(trial)
    return trials


def start_afresh(engines: Sequence[SpeculativeEngine]) -> None:
    """Empty the engines' caches, so the next trial prefills its prompt as `specdec run` does. (A trial
    that reused the previous one's cached prompt skipped the prefill and its after-effects: with the
    strategies in a fixed order, the first per prompt, plain, ran 4-5% slower than the others on the
    tiny models, and every ratio to it read that much high.)"""
    for engine in engines:
        engine.reset(0)


def geomean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def summarize(trials: Sequence[Trial], strategies: Sequence[Strategy], *, greedy: bool = True) -> list[StrategyReport]:
    """Per-strategy medians, speed-up over plain, adaptive against the best fixed k per prompt.

    ``greedy``: the trials decoded greedily, so each strategy's output can be compared with plain
    decoding's; sampled outputs differ wherever the random draws fell differently, so they aren't."""
    prompt_ids = list(dict.fromkeys(t.prompt_id for t in trials))
    plain = next((s.name for s in strategies if s.is_plain), None)
    compared = plain if greedy else None  # (the strategy outputs are compared with)
    present = {t.strategy for t in trials}
    by_case: dict[tuple[str, str], list[Trial]] = {}  # (strategy, prompt) -> its trials, in order
    for t in trials:
        by_case.setdefault((t.strategy, t.prompt_id), []).append(t)

    def med(name: str, pid: str) -> float:
        values = [t.throughput for t in by_case.get((name, pid), ())]
        return statistics.median(values) if values else 0.0

    def first_tokens(name: str, pid: str) -> tuple[int, ...] | None:
        return next((t.tokens for t in by_case.get((name, pid), ())), None)

    plain_tokens = {pid: first_tokens(plain, pid) for pid in prompt_ids} if compared else {}
    plain_trial = {(t.prompt_id, t.repeat): t.throughput for t in trials if t.strategy == plain}

    def paired(name: str, pid: str) -> float:
        ratios = [t.throughput / plain_trial[(pid, t.repeat)] for t in by_case.get((name, pid), ())
                  if plain_trial.get((pid, t.repeat))]
        return statistics.median(ratios) if ratios else 0.0

    plain_in_steps = {(t.prompt_id, t.repeat): t.in_plain_steps for t in trials if t.strategy == plain}

    def in_steps(name: str, pid: str) -> float | None:
        ratios = [base / t.in_plain_steps for t in by_case.get((name, pid), ())
                  if t.in_plain_steps and (base := plain_in_steps.get((pid, t.repeat)))]
        return statistics.median(ratios) if ratios else None

    def spread(name: str) -> tuple[float, float] | None:
        """(lowest, highest) per-repeat geomean over prompts of trial / plain trial, over the repeats where
        every prompt has both (None: no such repeat)."""
        by_repeat: dict[int, dict[str, float]] = {}
        for t in trials:
            base = plain_trial.get((t.prompt_id, t.repeat))
            if t.strategy == name and base:
                by_repeat.setdefault(t.repeat, {})[t.prompt_id] = t.throughput / base
        values = [geomean(list(r.values())) for r in by_repeat.values() if len(r) == len(prompt_ids)]
        return (min(values), max(values)) if values else None

    def same(name: str, pid: str) -> bool:
        """Whether every trial of ``name`` on ``pid`` wrote plain decoding's answer (one that drifted counts)."""
        return all(t.tokens == plain_tokens[pid] for t in by_case.get((name, pid), ()))
    # (drafter kind, prompt) -> best fixed-k median throughput, among the fixed k whose output on the
    # prompt is plain decoding's: a k whose batched passes tipped a near-tie wrote another answer
    # (often a more repetitive one, faster to draft), which is no like-for-like comparison. Only
    # where no fixed k kept plain's output do all of them count.
    best_fixed: dict[tuple[str, str], float] = {}
    for kind in {s.drafter.kind for s in strategies if s.is_fixed}:
        fixed = [s for s in strategies if s.is_fixed and s.drafter.kind == kind and s.name in present]
        for pid in prompt_ids:
            kept = [s for s in fixed if not compared or same(s.name, pid)]
            if kept or fixed:
                best_fixed[(kind, pid)] = max(med(s.name, pid) for s in kept or fixed)
    reports = []
    for s in strategies:
        mine = [t for t in trials if t.strategy == s.name]
        if not mine:
            continue
        per_prompt = {pid: (med(s.name, pid) / med(plain, pid) if plain and med(plain, pid) else 0.0)
                      for pid in prompt_ids}
        per_paired = {pid: paired(s.name, pid) for pid in prompt_ids} if plain else {}
        per_in_steps = {pid: r for pid in prompt_ids if (r := in_steps(s.name, pid)) is not None} \
            if plain and not s.peer else {}
        vs_best = {}
        if not s.peer and s.drafter.adaptive and s.drafter.kind != "none":
            vs_best = {pid: med(s.name, pid) / best_fixed[(s.drafter.kind, pid)] for pid in prompt_ids
                       if best_fixed.get((s.drafter.kind, pid))}
        shares = [t.python_share for t in mine if t.python_share is not None]
        reports.append(StrategyReport(
            name=s.name, median_throughput=statistics.median(t.throughput for t in mine),
            speedup=geomean(list(per_prompt.values())) if plain else 0.0,
            acceptance_rate=statistics.mean(t.acceptance_rate for t in mine),
            tokens_per_target_pass=statistics.mean(t.tokens_per_target_pass for t in mine),
            per_prompt_speedup=per_prompt, vs_best_fixed=vs_best, per_prompt_paired=per_paired,
            paired_speedup=geomean(list(per_paired.values())) if per_paired else None,
            paired_spread=spread(s.name) if plain and not s.peer else None,  # (peers run after ours: no pairs)
            per_prompt_in_steps=per_in_steps,
            paired_in_steps=geomean(list(per_in_steps.values())) if len(per_in_steps) == len(prompt_ids) else None,
            vs_best_fixed_geomean=geomean(list(vs_best.values())) if vs_best else None,
            python_share=statistics.median(shares) if shares else None,
            declined=statistics.median(t.declined for t in mine),
            draft_share=statistics.median(t.draft_share for t in mine),
            passes_by_verified=_mean_counts([t.passes_by_verified for t in mine]),
            greedy_match=(sum(same(s.name, p) for p in prompt_ids) / len(prompt_ids)) if compared and not s.peer
            else None,
            same_output={p: same(s.name, p) for p in prompt_ids} if compared and not s.peer else {}, peer=s.peer,
            plain=s.is_plain))
    return reports


def _mean_counts(counts: Sequence[Sequence[int]]) -> list[float]:
    """Item by item, the mean of ``counts`` (a missing item counts 0)."""
    size = max((len(c) for c in counts), default=0)
    return [sum(c[j] for c in counts if j < len(c)) / len(counts) for j in range(size)]


PEER_NAME = "llama-cpp-python lookup"


def peer_strategy(name: str = PEER_NAME, kind: str = "prompt-lookup") -> Strategy:
    """A report row for another implementation (not run by our decoder)."""
    return Strategy(name, DrafterSettings(kind=kind), peer=True)  # type: ignore[arg-type]


def run_peer_trials(name: str, generate: Callable[[str, list[int]], float],
                    prompts: Sequence[tuple[str, list[int]]], repeats: int) -> list[Trial]:
    """A peer on the same prompts: ``generate(prompt_id, tokens)`` returns its generation tok/s."""
    trials = []
    for rep in range(repeats):
        for prompt_id, tokens in prompts:
            trials.append(Trial(name, prompt_id, rep, generate(prompt_id, tokens), 0.0, 0.0, 0.0, ()))
    return trials
