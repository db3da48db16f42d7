"""llama.cpp's ngram-cache drafting replayed in the simulation beside adaptive prompt lookup: no timing noise.

Usage:
  python benchmarks/ngram_cache_sim.py --traces FILE.jsonl [--curve NAME[=...]] [-n 128] [--draft-max 8]

A replica of ``--spec-type ngram-cache`` (common/ngram-cache.cpp in the llama.cpp that llama-cpp-python
vendors: its context cache only): every drafted token is re-chosen from the counts of what followed
the 4-, 3-, 2- and 1-gram before it (the longest whose counts pass llama.cpp's sample-size and
percentage thresholds), up to ``--draft-max`` tokens (llama.cpp: 8), and every draft is verified. On
each trace (recorded outputs: benchmarks/record_traces.py) and curve it prints plain decoding's
simulated time over each strategy's: adaptive prompt lookup (cold, a fresh decoder), fixed k = 16 and
the replica; then the geomeans. (llama.cpp indexes each round's new tokens on their own, so the real
mode misses the n-grams spanning two rounds; the replica does not.)
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.decoder import SpeculativeDecoder  # noqa: E402
from specdec_gguf.engine import DrafterBase  # noqa: E402
from specdec_gguf.proposal import NO_PROPOSAL, DraftProposal  # noqa: E402
from specdec_gguf.simulation import Trace, VirtualClock, curve_profile, simulate_run  # noqa: E402
from policy_sim import load_traces, parse_curve  # noqa: E402

NGRAM_MAX = 4
# llama.cpp's draft_min_sample_size_lax and draft_min_percent_lax, per n-gram length 1..4
MIN_SAMPLES = (2, 2, 1, 1)
MIN_PERCENT = (66, 50, 50, 50)


class NgramCacheDrafter(DrafterBase):
    """Drafts token by token from the counts of what followed each 1..4-gram of the context."""

    name = "ngram-cache"

    def __init__(self) -> None:
        self.counts: defaultdict[tuple[int, ...], Counter[int]] = defaultdict(Counter)
        self.context: list[int] = []
        self._indexed = 0  # tokens before this position have their preceding n-grams counted

    def _index(self) -> None:
        ctx = self.context
        for i in range(max(self._indexed, 1), len(ctx)):
            for n in range(1, min(NGRAM_MAX, i) + 1):
                self.counts[tuple(ctx[i - n:i])][ctx[i]] += 1
        self._indexed = len(ctx)

    def start(self, prompt_tokens: Sequence[int]) -> None:
        self.counts.clear()
        self.context, self._indexed = list(prompt_tokens), 0
        self._index()

    def next_token(self, seq: Sequence[int]) -> int | None:
        """The token llama.cpp drafts after ``seq`` (None: no n-gram's counts pass the thresholds)."""
        for n in range(min(NGRAM_MAX, len(seq)), 0, -1):
            followers = self.counts.get(tuple(seq[-n:]))
            if not followers:
                continue
            token, count = followers.most_common(1)[0]
            total = sum(followers.values())
            if total >= MIN_SAMPLES[n - 1] and 100 * count >= MIN_PERCENT[n - 1] * total:
                return token
        return None

    def propose(self, max_tokens: int, policy: object = None, rng: object = None, budget: object = None) -> DraftProposal:
        seq, out = list(self.context), []
        while len(out) < max_tokens:
            token = self.next_token(seq)
            if token is None:
                break
            out.append(token)
            seq.append(token)
        return DraftProposal(tokens=tuple(out)) if out else NO_PROPOSAL

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.context.extend(committed)
        self._index()


def ngram_cache_seconds(trace: Trace, curve: str, max_tokens: int, draft_max: int = 8) -> float:
    """Simulated generation seconds of the replica on ``trace`` (every draft verified)."""
    clock = VirtualClock()
    decoder = SpeculativeDecoder(trace.target(curve_profile(curve), clock), NgramCacheDrafter(),
                                 num_draft_tokens=draft_max, adaptive=False, clock=clock)
    n = min(max_tokens, len(trace.output))
    result = decoder.generate(trace.prompt, n, ignore_eog=True)
    if result.tokens != trace.output[:n]:
        raise AssertionError(f"simulation of {trace.id} broke greedy exactness")
    return result.stats.generation_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, required=True, help="recorded outputs (record_traces.py)")
    parser.add_argument("--curve", action="append", help="a cost curve (policy_sim.py --curve); repeatable")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--draft-max", type=int, default=8)
    args = parser.parse_args()
    traces = load_traces(args.traces)
    for curve in [parse_curve(c) for c in args.curve or ["gemma-epyc"]]:
        rows = []
        for trace in traces:
            plain = simulate_run(trace, curve, args.n, 0).seconds
            row = (plain / simulate_run(trace, curve, args.n, None).seconds,
                   plain / simulate_run(trace, curve, args.n, 16).seconds,
                   plain / ngram_cache_seconds(trace, curve, args.n, args.draft_max))
            rows.append(row)
            print(f"{curve:<16} {trace.id:<32} adaptive {row[0]:5.2f}x  lookup k=16 {row[1]:5.2f}x  "
                  f"ngram-cache {row[2]:5.2f}x", flush=True)
        mean = [math.exp(sum(math.log(r[i]) for r in rows) / len(rows)) for i in range(3)]
        print(f"{curve}: geomean adaptive {mean[0]:.3f}x, lookup k=16 {mean[1]:.3f}x, ngram-cache {mean[2]:.3f}x")


if __name__ == "__main__":
    main()
