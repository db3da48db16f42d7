"""Where a free drafter's time goes per round on a model whose rounds take 100-250 us (the tiny F32 pair).

Usage:
  python benchmarks/round_overhead.py [--threads 1] [-n 64] [--repeats 30]

Arms, interleaved, a fresh decoder per trial (as `specdec run`), on the open-ended prompts of the
default set (nothing there to copy, so every round is a plain step whatever the drafter does):
- plain: no drafter;
- adaptive: adaptive prompt lookup as shipped;
- no-search: the same, but every search finds nothing (the schedule's and the drafter's work per
  round without the search itself);
- deferred: every round is claimed as a pause (``plain_rounds``) and told in one batch at the end;
- deferred-1: every round is a one-round pause, told at the start of the next.
Prints, per arm and prompt, the time over plain per round. ``--by-round``: instead, plain and adaptive only,
each round's time (median over the repeats) over plain's same round, summed by what the adaptive round did —
consulted the drafter, ran in a pause, told a pause before consulting again, or ended the generation — which is
where a tiny model's overhead sits (docs/performance.md, thirty-first). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.decoder import SpeculativeDecoder  # noqa: E402
from specdec_gguf.drafters import PromptLookupDrafter  # noqa: E402
from specdec_gguf.engines.llama_cpp import LlamaCppEngine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.proposal import NO_PROPOSAL, DraftProposal  # noqa: E402
from specdec_gguf.tiny import write_tiny_family  # noqa: E402

ARMS = ("plain", "adaptive", "no-search", "deferred", "deferred-1")


class _FindsNothing(PromptLookupDrafter):
    """Prompt lookup whose searches all come back empty."""

    def propose(self, *args: object, **kwargs: object) -> DraftProposal:
        return NO_PROPOSAL


def _decoder(target: LlamaCppEngine, arm: str) -> SpeculativeDecoder:
    if arm == "plain":
        return SpeculativeDecoder(target)
    decoder = SpeculativeDecoder(target, _FindsNothing() if arm == "no-search" else PromptLookupDrafter())
    if arm.startswith("deferred"):
        claimed = 1 if arm == "deferred-1" else 1 << 30
        decoder.schedule.plain_rounds = lambda: claimed  # type: ignore[method-assign]
    return decoder


def arguments(doc: str, threads: int, by_round: bool = False) -> argparse.Namespace:
    """The flags both round benchmarks take: --threads, -n, --repeats (and this one's --by-round)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    if by_round:
        parser.add_argument("--by-round", action="store_true", help="where the adaptive arm's time goes, round by round")
    return parser.parse_args()


READS = 5  # the decoder's clock readings a plain-step round: its start, the pass's start and end, the round's end, done
# ... and one fewer where the round verified drafted tokens (the pass's end is not read apart from the round's end).


def _rounds_timed(decoder: SpeculativeDecoder, tokens: list[int], n: int) -> tuple[list[float], list[str]]:
    """Run ``decoder`` on ``tokens``: each round's seconds (the decoder's own clock readings: ``READS`` a round
    after the prefill's 2, one fewer in a round that verified drafted tokens), and what each round did
    (``KINDS``; none without a drafter). Rounds are told apart by the target's one pass a round."""
    stamps: list[float] = []
    verified: list[int] = []  # per round, the drafted tokens its pass verified
    kinds: list[str] = []
    doing = ["pause"]  # what the current round did so far (until the round shows otherwise)
    clock, target = decoder.clock, decoder.target
    forward = target.forward_proposal

    def timed() -> float:
        stamps.append(clock())
        return stamps[-1]

    def forwarding(anchor, proposal, **kwargs):
        verified.append(len(proposal.tokens))
        kinds.append(doing[0])
        doing[0] = "pause"
        return forward(anchor, proposal, **kwargs)

    def marking(kind: str, call):
        def marked(*args, **kwargs):
            if doing[0] != "told":
                doing[0] = kind
            return call(*args, **kwargs)
        return marked

    decoder.clock = timed
    if decoder.drafter is not None:
        decoder.schedule.next_k = marking("consulted", decoder.schedule.next_k)  # type: ignore[method-assign]
        decoder._tell = marking("told", decoder._tell)  # type: ignore[method-assign]
    target.forward_proposal = forwarding  # type: ignore[method-assign]  (this engine only, until the run ends)
    try:
        decoder.generate(tokens, n, ignore_eog=True)
    finally:
        del target.forward_proposal
    rounds, at = [], 2
    for drafted in verified:
        reads = READS - 1 if drafted else READS
        rounds.append(stamps[at + reads - 1] - stamps[at])
        at += reads
    if at != len(stamps):  # (a decoder whose rounds read its clock otherwise: READS no longer says)
        raise RuntimeError(f"the decoder read its clock {len(stamps)} times where its {len(verified)} rounds "
                           f"account for {at}: update READS")
    if decoder.drafter is None:
        return rounds, []
    kinds[-1] = "last"
    return rounds, kinds


KINDS = ("consulted", "pause", "told", "last")


def by_round(target: LlamaCppEngine, tokenized: list[tuple[str, list[int]]], n: int, repeats: int) -> None:
    """Print, per prompt, the adaptive arm's excess over plain by what its rounds did (see the module docs)."""
    for pid, tokens in tokenized:
        times: dict[str, list[list[float]]] = {"plain": [], "adaptive": []}
        seen: list[list[str]] = []
        for rep in range(repeats):
            for arm in ("plain", "adaptive") if rep % 2 == 0 else ("adaptive", "plain"):
                rounds, kinds = _rounds_timed(_decoder(target, arm), tokens, n)
                times[arm].append(rounds)
                if arm == "adaptive":
                    seen.append(kinds)
        plain = [statistics.median(r[i] for r in times["plain"]) for i in range(n)]
        adaptive = [statistics.median(r[i] for r in times["adaptive"]) for i in range(n)]
        # (The kind a round most often had: a tiny model's pattern hardly varies between repeats.)
        kind = [max(KINDS, key=[k[i] for k in seen].count) for i in range(n)]
        cells = []
        for k in KINDS:
            excess = [(a - p) * 1e6 for a, p, kk in zip(adaptive, plain, kind) if kk == k]
            if excess:
                cells.append(f"{k} {len(excess)} rounds {sum(excess):+.0f} us ({sum(excess) / len(excess):+.1f} each)")
        total = (sum(adaptive) - sum(plain)) * 1e6
        print(f"{pid}: {total:+.0f} us an answer over plain ({sum(plain) * 1e3:.2f} ms): " + "; ".join(cells))


@contextmanager
def tiny_target(threads: int) -> Iterator[tuple[LlamaCppEngine, list[tuple[str, list[int]]]]]:
    """The tiny F32 target, written to a throw-away directory that is also the cache (profiles and
    calibrations of a throw-away model: not the user's), and the default set's open-ended prompts
    (nothing to copy: every round is a plain step whatever the drafter does), tokenized."""
    with tempfile.TemporaryDirectory(prefix="specdec-rounds-") as tmp:
        os.environ["SPECDEC_CACHE_DIR"] = tmp
        family = write_tiny_family(tmp)
        with LlamaCppEngine(family.target, n_ctx=2048, n_threads=threads) as target:
            yield target, [(pid, target.tokenize(text)) for pid, _, text in PROMPT_SETS["default"]
                           if pid in ("story", "explain")]


def main() -> None:
    args = arguments(__doc__, threads=1, by_round=True)
    seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
    with tiny_target(args.threads) as (target, tokenized):
        for arm in ARMS:  # warm up (and cache the cost profile)
            _decoder(target, arm).generate(tokenized[0][1], 16, ignore_eog=True)
        if args.by_round:
            by_round(target, tokenized, args.n, args.repeats)
            return
        for rep in range(args.repeats):
            for pid, tokens in tokenized:
                for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:
                    result = _decoder(target, arm).generate(tokens, args.n, ignore_eog=True)
                    seconds[arm, pid].append(result.stats.generation_seconds)
    pids = [pid for pid, _ in tokenized]
    plain = {pid: statistics.median(seconds["plain", pid]) for pid in pids}
    print(f"plain: {', '.join(f'{pid} {plain[pid] / args.n * 1e6:.1f} us/round' for pid in pids)}")
    for arm in ARMS[1:]:
        cells = []
        for pid in pids:
            t = statistics.median(seconds[arm, pid])
            cells.append(f"{pid} {plain[pid] / t:.3f}x plain ({(t - plain[pid]) / args.n * 1e6:+.1f} us/round)")
        print(f"{arm:11s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
