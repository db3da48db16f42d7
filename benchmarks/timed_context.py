"""Cost profiles priced with the flash attention timing's passes (shipped) against the profiles alone, side by side.

Usage:
  python benchmarks/timed_context.py CASE [--draft D.gguf] [--kind prompt-lookup|draft-model] [--threads 2]
                                     [-n 64] [--repeats 10] [--set default]

CASE: a tiny family of benchmarks/matrix.py (written to a temporary folder) or a target GGUF path (``--draft``
for its draft model). Answers every prompt of ``--set`` with plain decoding, with the adaptive schedule whose
profiles are the cached ones alone ("alone", as before the thirty-fifth session) and with the shipped schedule,
whose profiles take the flash attention timing's passes after 256 tokens as their long context where that
timing turned flash attention off and a profile has no long-context timing of its own
(``profile.with_timed_context``). A fresh decoder per answer (as `specdec run` starts), no calibrations
remembered between answers (each starts as a user's first), the three arms interleaved, their order rotating
by repeat. Prints what each engine's profile says after a long context, alone and priced; per prompt each
adaptive arm's median over repeats of its time over the same repeat's plain answer (above 1: faster than
plain), and per arm the drafted tokens, declined proposals and target passes an answer.
Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_constants import case_arguments, case_models  # noqa: E402

import specdec_gguf.profile as profile  # noqa: E402
from specdec_gguf.benchmark import geomean, start_afresh  # noqa: E402
from specdec_gguf.factory import make_decoder, open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402

ARMS = ("plain", "alone", "shipped")
_PRICED = profile.with_timed_context


@contextmanager
def profiles_alone(alone: bool) -> Iterator[None]:
    """While inside, ``profile_for`` returns the cached profiles as they are (``alone``) or as shipped."""
    profile.with_timed_context = (lambda measured, attention: measured) if alone else _PRICED
    try:
        yield
    finally:
        profile.with_timed_context = _PRICED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    case_arguments(parser, "draft-model")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--set", default="default", choices=list(PROMPT_SETS), help="built-in prompts")
    args = parser.parse_args()
    if args.repeats < 1 or args.n < 1:
        raise SystemExit(f"--repeats={args.repeats} and -n={args.n} must be >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        target_path, draft_path = case_models(args, Path(tmp))
        target = open_engine(EngineSettings(model=target_path, n_ctx=2048, n_threads=args.threads))
        draft = open_engine(EngineSettings(model=draft_path, n_ctx=2048, n_threads=args.threads)) \
            if args.kind == "draft-model" else None
        try:
            print(f"{args.case}, {args.kind}, '{args.set}' prompts, {args.threads} thread(s), {args.n} tokens, "
                  f"{args.repeats} repeats")
            for role, engine in (("target", target), ("draft", draft)):
                if engine is not None:
                    print(f"  {role}: {describe(engine)}")
            seconds, counts = run(args, target, draft)
        finally:
            for engine in (target, draft):
                if engine is not None:
                    engine.close()
    pids = [pid for pid, _, _ in PROMPT_SETS[args.set]]
    print("adaptive / plain, paired (per prompt the median over repeats of plain's time over the arm's)")
    for arm in ARMS[1:]:
        ratios = {pid: statistics.median(p / a for p, a in zip(seconds[("plain", pid)], seconds[(arm, pid)]))
                  for pid in pids}
        print(f"  {arm:<8} {geomean(list(ratios.values())):.3f}  " + " ".join(f"{p}={r:.3f}" for p, r in ratios.items()))
    print("an answer: drafted tokens / declined proposals / target passes")
    for arm in ARMS[1:]:
        print(f"  {arm:<8} " + " ".join(f"{pid}={'/'.join(f'{v / args.repeats:.1f}' for v in counts[(arm, pid)])}"
                                         for pid in pids))


def describe(engine) -> str:
    """What ``engine``'s profile says after a long context, alone and priced with its flash attention timing."""
    with profiles_alone(True):
        alone = profile.profile_for(engine)
    priced = profile.profile_for(engine)

    def long(p: profile.CostProfile | None) -> str:
        if p is None or not p.long_seconds:
            return "none"
        return f"after {p.long_context}: " + ", ".join(f"n={n} {s * 1e3:.2f} ms" for n, s in sorted(p.long_seconds.items()))

    chosen = engine.attention.summary() if engine.attention is not None else "flash attention not timed"
    return f"{chosen}; long context alone {long(alone)}, priced {long(priced)}"


def run(args: argparse.Namespace, target, draft) -> tuple[dict, dict]:
    """Seconds of generation per (arm, prompt), one per repeat; and per (arm, prompt) the summed drafted tokens,
    declined proposals and target passes."""
    seconds: dict[tuple[str, str], list[float]] = {}
    counts: dict[tuple[str, str], list[int]] = {}
    for rep in range(args.repeats):
        for pid, _, text in PROMPT_SETS[args.set]:
            prompt = target.tokenize(text)
            order = ARMS[rep % 3:] + ARMS[:rep % 3]  # (rotating: no arm always first)
            for arm in order:
                with profiles_alone(arm == "alone"):
                    kind = "none" if arm == "plain" else args.kind
                    decoder = make_decoder(target, DrafterSettings(kind=kind), draft if arm != "plain" else None,
                                           remember=False)
                start_afresh([e for e in (target, draft) if e is not None])
                stats = decoder.generate(prompt, args.n, ignore_eog=True).stats
                seconds.setdefault((arm, pid), []).append(stats.generation_seconds)
                total = counts.setdefault((arm, pid), [0, 0, 0])
                for i, value in enumerate((stats.drafted, stats.declined, stats.target_passes)):
                    total[i] += value
    return seconds, counts


if __name__ == "__main__":
    main()
