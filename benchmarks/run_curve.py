"""Measure what a draft model's runs pay, pass by pass, as judge.py's entries and policy_suite.py's
``--recorded FILE:RATIO+OVERHEAD:CURVE`` take it.

Usage: python benchmarks/run_curve.py TARGET.gguf --draft DRAFT.gguf [-t 2] [-n 64] [--runs 4] [--k 8]
                                      [--set default] [--name NAME]

measure_curve.py times each pass size alone, as `specdec calibrate` does; a run's verify passes come right
after the draft's passes, whose weights have taken the caches, and on the Intel Xeon model 167 such a curve
replayed tiny-wide's k = 8 at 2 threads 1.94x-2.19x plain where timing read 1.77x. This reads the costs off
real runs instead: per prompt of the set, a plain run, a fixed-k run and an adaptive one, each a fresh decoder
that prefills its prompt (as `specdec bench`'s trials), ``--runs`` rounds of them, the first a warm-up that is
not read, on an empty temporary user cache. Then

- T(1): the plain runs' generation seconds over their tokens (a plain step in a run of plain steps);
- T(n), n = 2, 3, 5, 9: the drafted runs' verify passes of n tokens, the median of each size (a size no round
  verified is interpolated between its neighbours; without a pass of 9 tokens, ``--k`` under 8, no curve is
  printed: what a longer pass costs can't be read off shorter ones);
- T(17), T(33), T(65) and the switch: timed once as measure_curve.py times them, the larger sizes scaled by the
  runs' T(9) over the timed one (the runs verify at most k + 1 tokens);
- the draft: a least-squares line through each proposal's draft seconds against its length, over T(1): a
  share per drafted token (RATIO) and one per proposal (OVERHEAD).

Prints the curve (``NAME=T1_MS:R2,R3,R5,R9,R17,R33,R65:SWITCH``), the draft's ``RATIO+OVERHEAD`` and the runs'
ratios over plain (per prompt the median over the rounds, and their geomean), for a replay
(``policy_sim.py --traces F --only-recorded --drafter draft-model --draft-ratio RATIO --draft-overhead OVERHEAD
--curve CURVE``) to be checked against. Time it with nothing else running.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.proposal import DraftProposal  # noqa: E402

RUN_SIZES = (2, 3, 5, 9)
TIMED_SIZES = (9, 17, 33, 65)

# (drafted, verified, draft seconds, verify seconds) of each round that drafted, in the order the runs made them
Round = tuple[int, int, float, float]


def recording(cls: type, rounds: list[Round]) -> type:
    """``cls`` (a schedule's class), appending each drafted round's passes to ``rounds`` as it observes them."""

    class Recording(cls):  # type: ignore[misc,valid-type]
        def observe(self, proposal: DraftProposal, verified: int, accepted: int, generated: int, greedy: bool,
                    draft_seconds: float, verify_seconds: float, *args, **kwargs) -> None:
            if proposal.tokens:
                rounds.append((len(proposal.tokens), verified, draft_seconds, verify_seconds))
            super().observe(proposal, verified, accepted, generated, greedy, draft_seconds, verify_seconds,
                            *args, **kwargs)

    return Recording


def verify_costs(rounds: Sequence[Round], sizes: Sequence[int] = RUN_SIZES) -> dict[int, float]:
    """The median verify pass of each of ``sizes`` (verified drafted tokens + 1) in ``rounds``; a size no round
    verified is interpolated linearly between the nearest sizes that have one (below them: the smallest); a size
    past the runs' longest pass is left out: nothing says what a longer one costs (a run with ``--k 4`` took its
    T(5) for T(9), and the timed larger sizes were scaled by it)."""
    by_size: dict[int, list[float]] = defaultdict(list)
    for _, verified, _, seconds in rounds:
        by_size[verified + 1].append(seconds)
    known = {n: statistics.median(v) for n, v in sorted(by_size.items()) if n > 1}
    if not known:
        raise SystemExit("no round verified a drafted token: nothing to read the verify passes from")
    costs = {}
    for n in (n for n in sizes if n <= max(known)):
        below = [m for m in known if m <= n]
        above = [m for m in known if m >= n]
        if not below:
            costs[n] = known[min(above)]
            continue
        lo, hi = max(below), min(above)
        costs[n] = known[lo] if lo == hi else known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
    return costs


def draft_line(rounds: Sequence[Round]) -> tuple[float, float]:
    """(seconds a proposal, seconds a drafted token): the least-squares line through each round's draft seconds
    against its proposal's length."""
    xs = [float(r[0]) for r in rounds]
    ys = [r[2] for r in rounds]
    if len(set(xs)) < 2:
        raise SystemExit(f"every proposal had {xs[0] if xs else 0:.0f} tokens: no line through them")
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def curve_entry(name: str, t1: float, runs: dict[int, float], timed: dict[int, float], switch: float) -> str:
    """policy_sim.py's ``--curve`` definition: the runs' T(1) and sizes up to 9, the larger ``timed`` sizes scaled
    by the runs' T(9) over the timed one, and ``switch`` (seconds) over T(1)."""
    scale = runs[9] / timed[9]
    ratios = [runs[n] / t1 for n in RUN_SIZES] + [timed[n] * scale / t1 for n in TIMED_SIZES[1:]]
    return f"{name}={t1 * 1e3:.3f}:" + ",".join(f"{r:.3f}" for r in ratios) + f":{switch / t1:.3f}"


def curve_line(name: str, t1: float, runs: dict[int, float], timed: dict[int, float], switch: float) -> str:
    """The printed ``curve:`` line: ``curve_entry``'s definition where the runs read every size up to 9, else why not
    (sizes past the runs' longest pass can't be read off them)."""
    longest = max(runs)
    if longest < RUN_SIZES[-1]:
        return (f"curve: not read (the runs' longest verify pass held {longest} tokens, T({RUN_SIZES[-1]}) can't be "
                f"read off them: run with --k {RUN_SIZES[-1] - 1} or more)")
    return f"curve: {curve_entry(name, t1, runs, timed, switch)}"


def draft_summary(overhead: float, per_token: float, t1: float, proposals: int) -> str:
    """The draft's line as ``--recorded`` takes it (RATIO+OVERHEAD over T(1)), with a warning where a share came out
    negative (policy_suite.py refuses it: noise, or proposals too alike in length to tell the two apart)."""
    line = (f"draft: {per_token / t1:.3f}+{overhead / t1:.3f} (RATIO+OVERHEAD: {per_token * 1e3:.3f} ms a drafted "
            f"token, {overhead * 1e3:.3f} ms a proposal; {proposals} proposals)")
    if overhead < 0 or per_token <= 0:
        line += "\n(a share below zero: noise or proposals too alike in length; run more rounds or longer answers)"
    return line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", type=int, default=64, help="answer length")
    parser.add_argument("--runs", type=int, default=4, help="rounds of runs, the first a warm-up (at least 2)")
    parser.add_argument("--k", type=int, default=8, help="the fixed-k run's proposal length")
    parser.add_argument("--set", default="default", help="the built-in prompt set")
    parser.add_argument("--name", default=None, help="the curve's name (default: the target file's stem)")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs {args.runs}: at least 2 (the first is a warm-up)")
    if not 1 <= args.k <= 64:
        parser.error(f"--k {args.k}: must lie in 1..64")
    before = os.environ.get("SPECDEC_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="specdec-run-curve-") as cache:
        os.environ["SPECDEC_CACHE_DIR"] = cache  # (the runs neither read nor leave the user's profiles)
        try:
            measure_runs(args)
        finally:
            if before is None:
                del os.environ["SPECDEC_CACHE_DIR"]
            else:
                os.environ["SPECDEC_CACHE_DIR"] = before


def measure_runs(args: argparse.Namespace) -> None:
    from specdec_gguf.benchmark import geomean, start_afresh
    from specdec_gguf.factory import make_decoder, open_engine
    from specdec_gguf.profile import measure
    from specdec_gguf.prompts import chosen_prompts
    from specdec_gguf.settings import DrafterSettings, EngineSettings

    target = open_engine(EngineSettings(model=args.model, n_ctx=2048, n_threads=args.threads))
    draft = open_engine(EngineSettings(model=args.draft, n_ctx=2048, n_threads=args.threads))
    arms = {"plain": DrafterSettings(kind="none"),
            f"k = {args.k}": DrafterSettings(kind="draft-model", adaptive=False, num_draft_tokens=args.k),
            "adaptive": DrafterSettings(kind="draft-model")}
    rounds: list[Round] = []
    seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
    plain_steps: list[float] = []
    try:
        texts = dict(chosen_prompts(args.set, None))
        for run in range(args.runs):
            for pid, text in texts.items():
                prompt = target.tokenize(text)
                for arm, settings in arms.items():
                    start_afresh([target, draft])
                    decoder = make_decoder(target, settings, None if arm == "plain" else draft)
                    kept: list[Round] = []
                    if arm != "plain":
                        decoder.schedule.__class__ = recording(type(decoder.schedule), kept)
                    stats = decoder.generate(prompt, args.n, ignore_eog=True).stats
                    if run:  # (the first round warms llama.cpp and the caches up)
                        seconds[(arm, pid)].append(stats.generation_seconds)
                        rounds += kept
                        if arm == "plain":
                            plain_steps.append(stats.generation_seconds / stats.generated_tokens)
        timed = measure(target, sizes=TIMED_SIZES, repeats=3, budget=60.0)
    finally:
        target.close()
        draft.close()
    t1 = statistics.median(plain_steps)
    runs = verify_costs(rounds)
    overhead, per_token = draft_line(rounds)
    name = args.name or args.model.stem
    longest = max(runs)
    print(curve_line(name, t1, runs, timed.seconds, timed.switch_seconds))
    print(draft_summary(overhead, per_token, t1, len(rounds)))
    for arm in list(arms)[1:]:
        ratios = {pid: statistics.median(seconds[("plain", pid)]) / statistics.median(seconds[(arm, pid)])
                  for pid in texts}
        print(f"{arm}: {geomean(list(ratios.values())):.3f}x plain ("
              + ", ".join(f"{pid} {r:.3f}x" for pid, r in ratios.items()) + ")")
    print(f"(the timed curve's T(9) {timed.seconds[9] * 1e3:.3f} ms, the runs' T({longest}) {runs[longest] * 1e3:.3f} "
          f"ms; {sum(1 for r in rounds if r[1])} verify passes read)")


if __name__ == "__main__":
    main()
