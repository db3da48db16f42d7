"""How close each strategy comes to the fastest any drafter could be: an oracle that drafts the answer itself.

Usage:
  python benchmarks/oracle.py MODEL.gguf [-t 2] [-n 128] [--set default] [--only ID,...] [--repeats 3]
                              [--k 16,32,64] [--peer-bin llama-speculative-simple] [--peer-python]
                              [--remember] [--exact]

Per prompt, plain decoding's answer is recorded first; then, interleaved per repeat (a fresh decoder per
trial whose engine prefills the prompt, as `specdec run` starts):
- plain decoding;
- the oracle at each fixed ``--k``: it proposes the next k tokens of the answer, so every drafted token is
  accepted and each pass takes k + 1 tokens (no drafter can do better at that k, whatever it knows);
- the copy oracle at the largest k: it proposes only as much of the answer as is a copy of the context
  there, from the best place, and only runs long enough that their pass takes no longer than plain steps
  would (from the target's cost curve, measured first): a drafter that copies from its context, as prompt
  lookup and llama.cpp's n-gram modes do, can hardly do better;
- adaptive prompt lookup as shipped (every run a first run; with ``--remember`` each reads and writes the
  remembered calibrations, as `specdec bench`'s trials do);
- with ``--peer-bin``, llama.cpp's n-gram modes (``LlamaCppPeer``); with ``--peer-python``, llama-cpp-python's
  ``LlamaPromptLookupDecoding(10)`` (after the others, as `specdec bench` runs it).
Prints per prompt each strategy's median throughput over plain's and its share of the best oracle's (the
ceiling), and the geomeans. On the default build a pass of k + 1 tokens can tip a near-tie plain decoding
settled otherwise, which would end an oracle's drafting there: so each oracle drafts the answer it gives
itself (``settled``), and a note says where a run still parted from it. ≠: an answer that is not plain
decoding's. What it answers: how much of a prompt's ceiling a strategy reaches, and so which ratios between
two strategies are possible at all (on a long copy both may sit near it). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.benchmark import geomean, start_afresh  # noqa: E402
from specdec_gguf.decoder import SpeculativeDecoder  # noqa: E402
from specdec_gguf.engine import DrafterBase, SpeculativeEngine  # noqa: E402
from specdec_gguf.factory import make_decoder, open_engine  # noqa: E402
from specdec_gguf.peers import NGRAM_MODES, LlamaCppPeer, find_llama_speculative  # noqa: E402
from specdec_gguf.profile import CostProfile, measure  # noqa: E402
from specdec_gguf.proposal import NO_PROPOSAL, DraftProposal, VerificationPolicy  # noqa: E402
from specdec_gguf.schedule import DraftBudget, FixedSchedule  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402
from ab_lookup import add_run_arguments, built_in_prompts  # noqa: E402


class OracleDrafter(DrafterBase):
    """Proposes the next tokens of a known answer while the output follows it (nothing once it parts); with
    ``copyable``, at each position of the answer only as many as are a copy of the context there."""

    name = "oracle"

    def __init__(self, answer: Sequence[int], copyable: Sequence[int] | None = None) -> None:
        self.answer = list(answer)
        self.copyable = list(copyable) if copyable is not None else None
        self._at = 0  # tokens committed so far
        self._parted = False  # the output left the answer (checked as tokens are committed, not per proposal)

    def start(self, prompt_tokens: Sequence[int]) -> None:
        self._at, self._parted = 0, False

    def propose(self, max_tokens: int, policy: VerificationPolicy, rng: np.random.Generator,
                budget: DraftBudget | None = None) -> DraftProposal:
        at = self._at
        if self._parted:
            return NO_PROPOSAL  # (nothing left to know)
        if self.copyable is not None:
            max_tokens = min(max_tokens, self.copyable[at] if at < len(self.copyable) else 0)
        tokens = self.answer[at:at + max_tokens]
        return DraftProposal(tokens=tuple(tokens)) if tokens else NO_PROPOSAL

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        at, self._at = self._at, self._at + len(committed)
        self._parted = self._parted or list(committed) != self.answer[at:self._at]


def copyable_runs(prompt: Sequence[int], answer: Sequence[int]) -> list[int]:
    """Per position i of ``answer``, the longest run of it from i on that some place in the context before i
    (the prompt and answer[:i]) is followed by: what a drafter that copies from its context, choosing the
    best place to copy from, could propose there. (A copy may run on into the tokens it proposes: a loop.)"""
    text = list(prompt) + list(answer)
    runs = []
    for i, first in enumerate(answer):
        here, best = len(prompt) + i, 0
        for start in range(here):
            if text[start] != first:
                continue
            length = 1
            while here + length < len(text) and text[start + length] == text[here + length]:
                length += 1
            best = max(best, length)
        runs.append(best)
    return runs


PLAIN = DrafterSettings(kind="none")


def copy_oracle_runs(prompt: Sequence[int], answer: Sequence[int], min_run: int) -> list[int]:
    """What the copy oracle may propose at each position of ``answer``: its copyable run, if ``min_run`` long."""
    return [r if r >= min_run else 0 for r in copyable_runs(prompt, answer)]


def oracle_decoder(target: SpeculativeEngine, answer: Sequence[int], k: int,
                   copyable: Sequence[int] | None = None) -> SpeculativeDecoder:
    """The oracle at fixed ``k``; given the runs it may propose (``copy_oracle_runs``), the copy oracle."""
    return SpeculativeDecoder(target, OracleDrafter(answer, copyable), schedule=FixedSchedule(k),
                              profile_cache=False, remember=False)


def paying_run(costs: CostProfile) -> int:
    """The shortest run of right drafted tokens whose pass takes no longer than plain steps would for them."""
    longest = 1024  # (no run pays on this curve: the copy oracle drafts none)
    return next((n for n in range(1, longest) if (n + 1) * costs.cost(1) >= costs.cost(n + 1)), longest)


def settled(target: SpeculativeEngine, prompt: Sequence[int], answer: Sequence[int], k: int, n: int,
            min_run: int | None = None, tries: int = 32) -> list[int]:
    """The answer the oracle at ``k`` (given ``min_run``: the copy oracle) drafts to the end: on the default build a
    pass of k + 1 tokens can tip a near-tie plain decoding settled otherwise (docs/exactness.md); the oracle's
    passes then start at the same places in every run, so its own answer, drafted again, parts later or not
    at all."""
    answer = list(answer)
    for _ in range(tries):
        start_afresh([target])
        decoder = oracle_decoder(target, answer, k, copy_oracle_runs(prompt, answer, min_run) if min_run else None)
        output = list(decoder.generate(prompt, n, ignore_eog=True).tokens)
        if output == answer:
            break
        answer = output
    return answer


def run(model: Path, *, threads: int, n: int, sets: str, only: str | None, repeats: int, ks: list[int],
        peer_bin: str | None, peer_python: bool, remember: bool, exact: bool) -> None:
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="specdec-oracle-")
    target = open_engine(EngineSettings(model=model, n_ctx=2048, n_threads=threads, exact=exact))
    prompts = built_in_prompts(target, sets, only)
    peers = [LlamaCppPeer(find_llama_speculative(peer_bin), model, mode, threads=threads, exact=exact)
             for mode in NGRAM_MODES] if peer_bin else []
    make_decoder(target, PLAIN).generate(prompts[0][2], 32, ignore_eog=True)  # warm llama.cpp up
    min_run = paying_run(measure(target, sizes=sorted({1, 2, 3, 5, 9, *(k + 1 for k in ks)}), repeats=3))
    oracles = {f"oracle k={k}": (k, None) for k in ks} | {f"copy oracle k={max(ks)}": (max(ks), min_run)}
    plain_answers: dict[str, list[int]] = {}
    drafts: dict[tuple[str, str], list[int]] = {}  # (oracle, prompt id): the answer that oracle drafts
    runs: dict[tuple[str, str], list[int] | None] = {}  # (oracle, prompt id): the copy oracle's runs (else None)
    for pid, _, tokens in prompts:
        start_afresh([target])
        plain_answers[pid] = list(make_decoder(target, PLAIN).generate(tokens, n, ignore_eog=True).tokens)
        for name, (k, least) in oracles.items():
            drafts[name, pid] = settled(target, tokens, plain_answers[pid], k, n, least)
            # (the copy oracle's runs, once per answer, not per trial: ~10 ms of Python each)
            runs[name, pid] = copy_oracle_runs(tokens, drafts[name, pid], least) if least else None
    speeds: dict[tuple[str, str], list[float]] = defaultdict(list)  # (strategy, prompt id): tok/s per trial
    parted: set[tuple[str, str]] = set()  # (strategy, prompt id): an answer that is not plain decoding's
    unsettled: set[tuple[str, str]] = set()  # (oracle, prompt id): a run that parted from its own answer
    for _ in range(repeats):
        for pid, text, tokens in prompts:
            arms = [("plain", make_decoder(target, PLAIN))]
            arms += [(name, oracle_decoder(target, drafts[name, pid], k, runs[name, pid]))
                     for name, (k, _) in oracles.items()]
            arms.append(("lookup adaptive", make_decoder(target, DrafterSettings(kind="prompt-lookup"),
                                                         remember=remember)))
            for name, decoder in arms:
                start_afresh([target])
                result = decoder.generate(tokens, n, ignore_eog=True)
                speeds[name, pid].append(result.stats.generation_throughput)
                if list(result.tokens) != plain_answers[pid]:
                    parted.add((name, pid))
                if name in oracles and list(result.tokens) != drafts[name, pid]:
                    unsettled.add((name, pid))
            for peer in peers:
                speeds[peer.name, pid].append(peer.run(text, n).throughput)
    if peer_python:
        target.close()  # (two copies of the model otherwise)
        time_llama_cpp_python(model, threads, prompts, n, repeats, speeds)
    for pid, _, tokens in prompts:
        drafted = copy_oracle_drafts(copyable_runs(tokens, plain_answers[pid]), max(ks), min_run)
        print(f"{pid}: the copy oracle drafts {drafted} of its {n} tokens (runs of {min_run}+ tokens)")
    print(f"{model.name}, {threads} thread(s), {n} tokens, {repeats} repeats, remember={remember}, exact={exact}: "
          "speed-up over plain (share of the best oracle's)")
    report(speeds, [pid for pid, _, _ in prompts], [f"oracle k={k}" for k in ks], parted)
    for name, pid in sorted(unsettled):
        print(f"note: {name} on {pid} parted from its own answer in some run (it drafted less there)")


def time_llama_cpp_python(model: Path, threads: int, prompts: Sequence[tuple[str, str, list[int]]], n: int,
                          repeats: int, speeds: dict[tuple[str, str], list[float]]) -> None:
    """llama-cpp-python's ``LlamaPromptLookupDecoding(10)`` on every prompt, ``repeats`` times, into ``speeds``."""
    from specdec_gguf.engines.llama_cpp.peer import PeerPromptLookup

    peer = PeerPromptLookup(model, n_ctx=2048, n_threads=threads)
    try:
        peer.generate(prompts[0][2], 16)  # warm-up
        for _ in range(repeats):
            for pid, _, tokens in prompts:
                speeds["llama-cpp-python lookup", pid].append(peer.generate(tokens, n)[1])
    finally:
        peer.close()


def copy_oracle_drafts(runs: Sequence[int], k: int, min_run: int) -> int:
    """How many of an answer's tokens the copy oracle drafts, given its ``copyable_runs``."""
    at = drafted = 0
    while at < len(runs):
        length = min(runs[at], k, len(runs) - at - 1) if runs[at] >= min_run else 0
        drafted, at = drafted + length, at + length + 1
    return drafted


def report(speeds: dict[tuple[str, str], list[float]], pids: Sequence[str], ceilings: Sequence[str],
           parted: set[tuple[str, str]]) -> None:
    """Per strategy and prompt, the median speed-up over plain and its share of the best of ``ceilings``."""
    names = list(dict.fromkeys(name for name, _ in speeds))
    ratio = {(name, pid): statistics.median(speeds[name, pid]) / statistics.median(speeds["plain", pid])
             for name in names for pid in pids}
    ceiling = {pid: max(ratio[name, pid] for name in ceilings) for pid in pids}
    print(f"{'strategy':<24}" + "".join(f"{pid:>24}" for pid in pids) + f"{'geomean':>18}")
    for name in names:
        cells = [f"{ratio[name, pid]:.2f}x ({ratio[name, pid] / ceiling[pid]:.2f}){' ≠' if (name, pid) in parted else '  '}"
                 for pid in pids]
        print(f"{name:<24}" + "".join(f"{cell:>24}" for cell in cells)
              + f"{geomean([ratio[name, pid] for pid in pids]):>12.2f}x"
              + f" ({geomean([ratio[name, pid] / ceiling[pid] for pid in pids]):.2f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser, n=128, sets="default")
    parser.add_argument("--k", default="16,32,64", help="the oracle's pass sizes (drafted tokens), comma-separated")
    parser.add_argument("--peer-bin", help="llama-speculative-simple: adds llama.cpp's n-gram modes")
    parser.add_argument("--peer-python", action="store_true", help="adds llama-cpp-python's LlamaPromptLookupDecoding(10)")
    parser.add_argument("--remember", action="store_true", help="adaptive runs read and write remembered calibrations")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    if any(k < 1 for k in ks):
        raise SystemExit(f"--k {args.k}: pass sizes must be >= 1")
    run(args.model, threads=args.threads, n=args.n, sets=args.set, only=args.only, repeats=args.repeats, ks=ks,
        peer_bin=args.peer_bin, peer_python=args.peer_python, remember=args.remember, exact=args.exact)


if __name__ == "__main__":
    main()
