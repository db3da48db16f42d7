"""A user's first runs with a pair: how often an answer, started on an empty user cache, stops drafting for good.

Usage:
  python benchmarks/fresh_starts.py CASE [--draft D.gguf] [--kind draft-model|prompt-lookup] [--threads 2]
                                    [-n 64] [--processes 30] [--set default] [--variant NAME:field=value,...]
                                    [--temp 0.8 --seed 0]

CASE: a tiny family of benchmarks/matrix.py (written to a temporary folder) or a target GGUF path (``--draft``
for its draft model). Each of ``--processes`` processes, run one after another, starts with an empty user
cache — no cost profile, no remembered calibration, as a user's first `specdec run` with the pair — measures
the profiles as such a run does, and answers every prompt of ``--set`` once with the adaptive schedule, a
fresh decoder per prompt (the later prompts read what the earlier ones stored, as a user's next runs do).
With ``--variant`` (a ``ScheduleConstants`` change, as ``ab_constants.py`` takes it) each variant runs the same
number of processes, each in a cache of its own, the arms' processes alternating. ``--temp`` samples (process i
with seed ``--seed`` + i, alike in every arm) instead of decoding greedily.

An answer *stalls* when at least half of its tokens came from plain steps (rounds that verified no drafted
token). Where drafting pays (tiny-wide, the 16-layer pair) a stall is the schedule pricing drafting out of a
run on its first outcomes and never looking again: such an answer runs at plain speed where the others run
1.5x. Where plain decoding is the optimum (tiny F32) a stall is the right answer. Prints per arm the stalled
answers, per prompt, and the median milliseconds an answer. The host's state decides many stalls (a
profile measured in a fast moment prices every later pass high), so stalls come in batches: compare arms
over tens of processes, not a few. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_constants import case_arguments, case_models, parse_variant, sampling_for  # noqa: E402

from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.stats import SpecStats  # noqa: E402


def plain_share(stats: SpecStats) -> float:
    """The share of an answer's tokens that came from plain steps (passes that verified no drafted token, one
    token each: ``SpecStats.passes_by_verified[0]``)."""
    return stats.passes_by_verified[0] / stats.generated_tokens if stats.generated_tokens else 0.0


def answer(args: argparse.Namespace) -> None:
    """The child: every prompt of the set once, a fresh decoder each; one JSON line per answer."""
    from specdec_gguf.benchmark import start_afresh
    from specdec_gguf.factory import make_decoder, open_engine
    from specdec_gguf.settings import DrafterSettings, EngineSettings

    constants = parse_variant(args.child)[1] if ":" in args.child else None
    target = open_engine(EngineSettings(model=args.target, n_ctx=2048, n_threads=args.threads))
    draft = open_engine(EngineSettings(model=args.draft, n_ctx=2048, n_threads=args.threads)) \
        if args.kind == "draft-model" else None
    engines = [e for e in (target, draft) if e is not None]
    try:
        for pid, _, text in PROMPT_SETS[args.set]:
            decoder = make_decoder(target, DrafterSettings(kind=args.kind), draft, constants=constants)
            start_afresh(engines)
            stats = decoder.generate(target.tokenize(text), args.n, sampling_for(args.temp, args.seed),
                                     ignore_eog=True).stats
            print(json.dumps({"prompt": pid, "ms": 1e3 * stats.generation_seconds, "plain": plain_share(stats)}),
                  flush=True)
    finally:
        for engine in engines:
            engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    case_arguments(parser, "draft-model")
    parser.add_argument("--processes", type=int, default=30)
    parser.add_argument("--set", default="default", choices=list(PROMPT_SETS), help="built-in prompts")
    parser.add_argument("--variant", action="append", default=[], help="NAME:field=value,... (repeatable)")
    parser.add_argument("--temp", type=float, default=0.0, help="sample at this temperature (0: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="with --temp: the first process's sampling seed")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # (an arm's spec: run in a process of its own)
    parser.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.processes < 1 or args.n < 1 or not args.temp >= 0.0:
        raise SystemExit(f"--processes={args.processes} and -n={args.n} must be >= 1, --temp={args.temp} >= 0")
    if args.child is not None:
        answer(args)
        return
    for spec in args.variant:
        parse_variant(spec)  # (refuse a bad variant before any process runs)
    arms = ["shipped"] + args.variant
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = case_models(args, Path(tmp))
        answers: dict[str, list[dict]] = {arm: [] for arm in arms}
        for i in range(args.processes):
            for arm in arms if i % 2 == 0 else arms[::-1]:  # (alternating: no arm always runs first)
                cache = Path(tmp) / f"cache-{arm.partition(':')[0]}-{i}"
                command = [sys.executable, __file__, args.case, "--child", arm, "--target", str(target), "--kind", args.kind,
                           "--threads", str(args.threads), "-n", str(args.n), "--set", args.set,
                           "--temp", str(args.temp), "--seed", str(args.seed + i)]
                if draft is not None:
                    command += ["--draft", str(draft)]
                done = subprocess.run(command, env={**os.environ, "SPECDEC_CACHE_DIR": str(cache)},
                                      capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"arm {arm!r}, process {i}: exit status {done.returncode}\n{done.stderr}")
                answers[arm] += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    decoding = f"temperature {args.temp}, seed {args.seed} + process" if args.temp > 0 else "greedy"
    print(f"{args.case}, {args.kind}, {decoding}, '{args.set}' prompts, {args.threads} thread(s), {args.n} tokens, "
          f"{args.processes} processes on an empty user cache each: answers that stalled (half their tokens or "
          "more from plain steps)")
    for arm in arms:
        rows = answers[arm]
        stalled = [row["prompt"] for row in rows if row["plain"] >= 0.5]
        by_prompt = " ".join(f"{pid}={stalled.count(pid)}" for pid in dict.fromkeys(row["prompt"] for row in rows))
        print(f"  {arm.partition(':')[0]:<12} {len(stalled):3d} of {len(rows)}  ({by_prompt}); "
              f"median {statistics.median(row['ms'] for row in rows):.1f} ms an answer")


if __name__ == "__main__":
    main()
