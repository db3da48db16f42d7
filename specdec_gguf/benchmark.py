"""Benchmarks: plain vs speculative strategies on the same loaded models, interleaved, with repeats.

Speed lives here, never in unit tests. The cost model's optimum for a drafter is
``max_k tokens_per_pass(k) / (verify(k + 1) / verify(1) + k * draft_per_token / verify(1))``
over the fixed-k runs: measured acceptance and llama.cpp's measured pass costs, with
zero Python overhead — what the hardware allows for that drafter.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .config import DrafterSettings
from .engine import SpeculativeEngine, TextModel
from .factory import make_decoder
from .sampling import SamplingParams


@dataclass(frozen=True)
class Strategy:
    """One way of generating, named for the report."""

    name: str
    drafter: DrafterSettings

    @property
    def is_plain(self) -> bool:
        return self.drafter.kind == "none"


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


@dataclass
class StrategyReport:
    name: str
    median_throughput: float
    speedup: float  # geometric mean over prompts of median(strategy) / median(plain)
    acceptance_rate: float
    tokens_per_target_pass: float
    predicted_optimum: float | None = None  # speed-up the cost model allows for this drafter
    share_of_optimum: float | None = None
    per_prompt_speedup: dict[str, float] = field(default_factory=dict)
    greedy_match: float | None = None  # share of prompts whose output equals plain decoding's
    python_share: float | None = None  # median share of generation time outside llama_decode


def measure_cost_curve(target: SpeculativeEngine, context: Sequence[int], sizes: Sequence[int],
                       repeats: int = 5) -> dict[int, float]:
    """Median seconds of one target pass over n tokens, for each n in ``sizes``."""
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
    return curve


def run_trials(target: TextModel, draft: TextModel | None, strategies: Sequence[Strategy],
               prompts: Sequence[tuple[str, list[int]]], max_tokens: int, repeats: int,
               sampling: SamplingParams = SamplingParams(),
               on_trial: Callable[[Trial], None] | None = None) -> list[Trial]:
    """Every strategy on every prompt, interleaved (A B C A B C ...), after one warm-up each.

    End-of-generation tokens are ignored so every trial generates ``max_tokens`` tokens.
    """
    decoders = {s.name: make_decoder(target, s.drafter, draft) for s in strategies}
    warm_prompt = prompts[0][1]
    for s in strategies:
        decoders[s.name].generate(warm_prompt, min(16, max_tokens), sampling, ignore_eog=True)
    trials = []
    engines = [e for e in (target, draft) if e is not None]
    for rep in range(repeats):
        for prompt_id, tokens in prompts:
            for s in strategies:
                decode_before = sum(e.decode_seconds for e in engines)
                r = decoders[s.name].generate(tokens, max_tokens, sampling, ignore_eog=True)
                st = r.stats
                # The prefill's decode time is not part of generation: subtract its share of this run.
                decoded = sum(e.decode_seconds for e in engines) - decode_before
                in_llama = decoded - st.prefill_seconds
                share = 1.0 - in_llama / st.generation_seconds if st.generation_seconds and decoded else None
                trial = Trial(s.name, prompt_id, rep, st.generation_throughput, st.acceptance_rate,
                              st.tokens_per_target_pass, st.draft_seconds / st.drafted if st.drafted else 0.0,
                              tuple(r.tokens), share)
                trials.append(trial)
                if on_trial:
                    on_trial(trial)
    return trials


def _geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    if not values:
        return 0.0
    product = 1.0
    for v in values:
        product *= v
    return product ** (1 / len(values))


def summarize(trials: Sequence[Trial], strategies: Sequence[Strategy],
              cost_curve: dict[int, float] | None = None) -> list[StrategyReport]:
    """Per-strategy medians, speed-up over plain, and distance to the cost model's optimum."""
    prompt_ids = list(dict.fromkeys(t.prompt_id for t in trials))
    plain = next((s.name for s in strategies if s.is_plain), None)

    def med(name: str, pid: str) -> float:
        return statistics.median(t.throughput for t in trials if t.strategy == name and t.prompt_id == pid)

    def first_tokens(name: str, pid: str) -> tuple[int, ...]:
        return next(t.tokens for t in trials if t.strategy == name and t.prompt_id == pid)

    reports = []
    for s in strategies:
        mine = [t for t in trials if t.strategy == s.name]
        per_prompt = {pid: (med(s.name, pid) / med(plain, pid) if plain and med(plain, pid) else 0.0)
                      for pid in prompt_ids}
        reports.append(StrategyReport(
            name=s.name, median_throughput=statistics.median(t.throughput for t in mine),
            speedup=_geomean(list(per_prompt.values())) if plain else 0.0,
            acceptance_rate=statistics.mean(t.acceptance_rate for t in mine),
            tokens_per_target_pass=statistics.mean(t.tokens_per_target_pass for t in mine),
            per_prompt_speedup=per_prompt,
            python_share=statistics.median(shares) if (shares := [t.python_share for t in mine
                                                                  if t.python_share is not None]) else None,
            greedy_match=(sum(first_tokens(s.name, p) == first_tokens(plain, p) for p in prompt_ids)
                          / len(prompt_ids)) if plain else None))
    if cost_curve:
        _attach_optimum(reports, strategies, trials, cost_curve)
    return reports


def predicted_speedup(tokens_per_pass: float, k: int, cost_curve: dict[int, float],
                      draft_per_token: float) -> float | None:
    """The cost model's speed-up over plain decoding for a fixed-k run."""
    if k + 1 not in cost_curve or 1 not in cost_curve:
        return None
    one = cost_curve[1]
    return tokens_per_pass / (cost_curve[k + 1] / one + k * draft_per_token / one)


def _attach_optimum(reports: list[StrategyReport], strategies: Sequence[Strategy],
                    trials: Sequence[Trial], cost_curve: dict[int, float]) -> None:
    """For each drafter kind, the best predicted speed-up over its fixed-k runs."""
    best: dict[str, float] = {}
    for s in strategies:
        if s.is_plain or s.drafter.adaptive:
            continue
        mine = [t for t in trials if t.strategy == s.name]
        tpp = statistics.mean(t.tokens_per_target_pass for t in mine)
        d = statistics.mean(t.draft_per_token for t in mine)
        pred = predicted_speedup(tpp, s.drafter.num_draft_tokens, cost_curve, d)
        if pred is not None:
            best[s.drafter.kind] = max(best.get(s.drafter.kind, 1.0), pred)
    for report, s in zip(reports, strategies):
        if s.drafter.kind in best:
            report.predicted_optimum = best[s.drafter.kind]
            report.share_of_optimum = report.speedup / best[s.drafter.kind]


PEER_NAME = "llama-cpp-python lookup"


def peer_strategy() -> Strategy:
    """The report row for llama-cpp-python's LlamaPromptLookupDecoding(num_pred_tokens=10)."""
    return Strategy(PEER_NAME, DrafterSettings(kind="prompt-lookup", num_draft_tokens=10, adaptive=True))


def run_peer_trials(peer: object, prompts: Sequence[tuple[str, list[int]]], max_tokens: int,
                    repeats: int) -> list[Trial]:
    """The peer (an object with ``generate(tokens, max_tokens) -> (tokens, tok/s)``) on the same prompts."""
    generate = getattr(peer, "generate")
    generate(prompts[0][1], min(16, max_tokens))  # warm-up
    trials = []
    for rep in range(repeats):
        for prompt_id, tokens in prompts:
            out, rate = generate(tokens, max_tokens)
            trials.append(Trial(PEER_NAME, prompt_id, rep, rate, 0.0, 0.0, 0.0, tuple(out)))
    return trials
