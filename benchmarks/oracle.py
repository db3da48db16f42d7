"""How close each strategy comes to the fastest any drafter could be: an oracle that drafts the answer itself.

Usage:
  python benchmarks/oracle.py MODEL.gguf [-t 2] [-n 128] [--set default] [--only ID,...] [--repeats 3]
                              [--k 16,32,64] [--peer-bin llama-speculative-simple] [--peer-python]
                              [--remember] [--exact]

Per prompt, plain decoding's answer is recorded first; then, interleaved per repeat (a fresh decoder per
trial whose engine prefills the prompt, as `specdec run` starts): plain decoding, the oracle at each fixed
``--k`` (it proposes the next k tokens of the recorded answer, so every drafted token is accepted and each
pass takes k + 1 tokens: no drafter can do better at that k, whatever it knows), the copy oracle at the
largest k (it proposes only as much of the answer as is a copy of the context there, from the best place,
and only runs long enough that their pass takes no longer than plain steps would (from the target's cost
curve, measured first): a drafter that copies from its context, as prompt lookup and llama.cpp's n-gram
modes do, can hardly do better), adaptive prompt lookup as
shipped (every run a first run; with
``--remember`` each reads and writes the remembered calibrations, as `specdec bench`'s trials do), and with
``--peer-bin`` llama.cpp's n-gram modes (``LlamaCppPeer``). Prints per prompt each
strategy's median throughput over plain's and its share of the best oracle's (the ceiling), and the
geomeans. An answer that parts from the recorded one (a near-tie tipped by another pass size on the default
build) would end the oracle's drafting there: so each oracle drafts the answer it gives itself (``settled``),
and a note says where a run still parted from it. ≠: a strategy's answer is not plain decoding's.
What it answers: how much of a prompt's ceiling a strategy reaches, and so which ratios between two
strategies are possible at all (on a copy both may sit near it). Run it on an otherwise idle machine.
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
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.proposal import NO_PROPOSAL, DraftProposal, VerificationPolicy  # noqa: E402
from specdec_gguf.schedule import DraftBudget, FixedSchedule  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402


class OracleDrafter(DrafterBase):
    """Proposes the next tokens of a known answer while the output follows it (nothing once it parts); with
    ``copyable``, at each position of the answer only as many as are a copy of the context there."""

    name = "oracle"

    def __init__(self, answer: Sequence[int], copyable: Sequence[int] | None = None) -> None:
        self.answer = list(answer)
        self.copyable = list(copyable) if copyable is not None else None
        self._committed: list[int] = []

    def start(self, prompt_tokens: Sequence[int]) -> None:
        self._committed = []

    def propose(self, max_tokens: int, policy: VerificationPolicy, rng: np.random.Generator,
                budget: DraftBudget | None = None) -> DraftProposal:
        at = len(self._committed)
        if self._committed != self.answer[:at]:
            return NO_PROPOSAL  # (parted from the answer: nothing left to know)
        if self.copyable is not None:
            max_tokens = min(max_tokens, self.copyable[at] if at < len(self.copyable) else 0)
        tokens = self.answer[at:at + max_tokens]
        return DraftProposal(tokens=tuple(tokens)) if tokens else NO_PROPOSAL

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self._committed.extend(committed)


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


def oracle_decoder(target: SpeculativeEngine, answer: Sequence[int], k: int,
                   copy_from: Sequence[int] | None = None, min_run: int = 1) -> SpeculativeDecoder:
    """The oracle at fixed ``k``; given the prompt (``copy_from``), the copy oracle (see copyable_runs),
    proposing only runs of at least ``min_run`` tokens."""
    copyable = [r if r >= min_run else 0 for r in copyable_runs(copy_from, answer)] if copy_from is not None \
        else None
    return SpeculativeDecoder(target, OracleDrafter(answer, copyable), schedule=FixedSchedule(k),
                              profile_cache=False, remember=False)


def paying_run(costs: CostProfile) -> int:
    """The shortest run of right drafted tokens whose pass takes no longer than plain steps would for them."""
    return next(n for n in range(1, 1024) if (n + 1) * costs.cost(1) >= costs.cost(n + 1))


def settled(target: SpeculativeEngine, prompt: Sequence[int], answer: Sequence[int], k: int, n: int,
            min_run: int | None = None, tries: int = 32) -> list[int]:
    """The answer the oracle at ``k`` (given ``min_run``: the copy oracle) drafts to the end: on the default build a
    pass of k + 1 tokens can tip a near-tie plain decoding settled otherwise (docs/exactness.md); the oracle's
    passes then start at the same places in every run, so its own answer, drafted again, parts later or not
    at all."""
    answer = list(answer)
    for _ in range(tries):
        start_afresh([target])
        decoder = oracle_decoder(target, answer, k, prompt if min_run else None, min_run or 1)
        output = list(decoder.generate(prompt, n, ignore_eog=True).tokens)
        if output == answer:
            break
        answer = output
    return answer


def run(model: Path, *, threads: int, n: int, sets: str, only: str | None, repeats: int, ks: list[int],
        peer_bin: str | None, peer_python: bool, remember: bool, exact: bool) -> None:
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="specdec-oracle-")
    target = open_engine(EngineSettings(model=model, n_ctx=2048, n_threads=threads, exact=exact))
    prompts = [(pid, text, target.tokenize(text)) for name in sets.split(",") for pid, _, text in PROMPT_SETS[name]
               if only is None or pid in only.split(",")]
    if not prompts:
        raise SystemExit(f"no prompt of {sets} is in --only {only}")
    peers = [LlamaCppPeer(find_llama_speculative(peer_bin), model, mode, threads=threads, exact=exact)
             for mode in NGRAM_MODES] if peer_bin else []
    plain = DrafterSettings(kind="none")
    make_decoder(target, plain).generate(prompts[0][2], 32, ignore_eog=True)  # warm llama.cpp up
    min_run = paying_run(measure(target, sizes=sorted({1, 2, 3, 5, 9, *(k + 1 for k in ks)}), repeats=3))
    copy_arm = f"copy oracle k={max(ks)}"
    answers: dict = {}  # prompt id: plain decoding's answer; (prompt id, oracle): the answer it drafts
    for pid, _, tokens in prompts:
        start_afresh([target])
        answers[pid] = make_decoder(target, plain).generate(tokens, n, ignore_eog=True).tokens
        for k in ks:
            answers[pid, f"oracle k={k}"] = settled(target, tokens, answers[pid], k, n)
        answers[pid, copy_arm] = settled(target, tokens, answers[pid], max(ks), n, min_run)
    speeds: dict[tuple[str, str], list[float]] = defaultdict(list)
    parted: set[tuple[str, str]] = set()  # (strategy, prompt): an answer that is not plain decoding's
    unsettled: set[tuple[str, str]] = set()  # an oracle that parted from its own answer (drafted less)
    for _ in range(repeats):
        for pid, text, tokens in prompts:
            arms = [("plain", make_decoder(target, plain))]
            arms += [(f"oracle k={k}", oracle_decoder(target, answers[pid, f"oracle k={k}"], k)) for k in ks]
            arms.append((copy_arm, oracle_decoder(target, answers[pid, copy_arm], max(ks), tokens, min_run)))
            arms.append(("lookup adaptive", make_decoder(target, DrafterSettings(kind="prompt-lookup"),
                                                         remember=remember)))
            for name, decoder in arms:
                start_afresh([target])
                result = decoder.generate(tokens, n, ignore_eog=True)
                speeds[name, pid].append(result.stats.generation_throughput)
                if list(result.tokens) != list(answers[pid]):
                    parted.add((name, pid))
                if (pid, name) in answers and list(result.tokens) != answers[pid, name]:
                    unsettled.add((name, pid))
            for peer in peers:
                speeds[peer.name, pid].append(peer.run(text, n).throughput)
    if peer_python:
        from specdec_gguf.engines.llama_cpp.peer import PeerPromptLookup

        target.close()
        peer = PeerPromptLookup(model, n_ctx=2048, n_threads=threads)
        try:
            peer.generate(prompts[0][2], 16)  # warm-up
            for _ in range(repeats):
                for pid, _, tokens in prompts:
                    speeds["llama-cpp-python lookup", pid].append(peer.generate(tokens, n)[1])
        finally:
            peer.close()
    names = list(dict.fromkeys(name for name, _ in speeds))
    ratio = {(name, pid): statistics.median(speeds[name, pid]) / statistics.median(speeds["plain", pid])
             for name in names for pid, _, _ in prompts}
    ceiling = {pid: max(ratio[f"oracle k={k}", pid] for k in ks) for pid, _, _ in prompts}
    for pid, _, tokens in prompts:  # (how much of the answer is a copy of its context, as the copy oracle sees it)
        runs, at, drafted = copyable_runs(tokens, answers[pid]), 0, 0
        while at < len(runs):
            run = min(runs[at], max(ks), len(runs) - at - 1) if runs[at] >= min_run else 0
            drafted, at = drafted + run, at + run + 1
        print(f"{pid}: the copy oracle drafts {drafted} of its {len(runs)} tokens (runs of {min_run}+ tokens)")
    print(f"{model.name}, {threads} thread(s), {n} tokens, {repeats} repeats, remember={remember}, exact={exact}: "
          "speed-up over plain (share of the best oracle's)")
    print(f"{'strategy':<24}" + "".join(f"{pid:>24}" for pid, _, _ in prompts) + f"{'geomean':>18}")
    for name in names:
        cells = [f"{ratio[name, pid]:.2f}x ({ratio[name, pid] / ceiling[pid]:.2f}){' ≠' if (name, pid) in parted else '  '}"
                 for pid, _, _ in prompts]
        print(f"{name:<24}" + "".join(f"{cell:>24}" for cell in cells)
              + f"{geomean([ratio[name, pid] for pid, _, _ in prompts]):>12.2f}x"
              + f" ({geomean([ratio[name, pid] / ceiling[pid] for pid, _, _ in prompts]):.2f})", flush=True)
    for name, pid in sorted(unsettled):
        print(f"note: {name} on {pid} parted from its own answer in some run (it drafted less there)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--set", default="default", help="built-in prompt sets, comma-separated")
    parser.add_argument("--only", help="prompt ids to run (comma-separated; default: every prompt of the sets)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", default="16,32,64", help="the oracle's pass sizes (drafted tokens), comma-separated")
    parser.add_argument("--peer-bin", help="llama-speculative-simple: adds llama.cpp's n-gram modes")
    parser.add_argument("--peer-python", action="store_true", help="adds llama-cpp-python's LlamaPromptLookupDecoding(10)")
    parser.add_argument("--remember", action="store_true", help="adaptive runs read and write remembered calibrations")
    parser.add_argument("--exact", action="store_true", help="the target in exact mode (docs/exactness.md)")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    if any(k < 1 for k in ks):
        raise SystemExit(f"--k {args.k}: pass sizes must be >= 1")
    run(args.model, threads=args.threads, n=args.n, sets=args.set, only=args.only, repeats=args.repeats, ks=ks,
        peer_bin=args.peer_bin, peer_python=args.peer_python, remember=args.remember, exact=args.exact)


if __name__ == "__main__":
    main()
