"""Adaptive prompt lookup with and without following loops (``PromptLookupDrafter(follow_loops=)``), side by side.

Usage:
  python benchmarks/ab_loops.py MODEL.gguf [-t 2] [-n 128] [--set default,short] [--repeats 3] [--remember] [--exact]

Arms, interleaved per prompt and repeat as `specdec bench` interleaves its strategies: plain decoding,
adaptive prompt lookup whose proposals stop at the context's end ("stop"), and the shipped one, which
copies a context that repeats itself on past its end ("loops"). A fresh decoder per trial whose engine
prefills the prompt (as `specdec run` starts), in one temporary user cache: cost profiles are shared,
remembered calibrations only with ``--remember`` (else every run is a first run). Prints per prompt each
arm's median throughput over plain's (≠: an answer that is not plain decoding's) and the geomeans.
``--exact`` loads the target in exact mode (a GGML_LLAMAFILE=OFF build: docs/exactness.md). Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.benchmark import Strategy, Trial, start_afresh, summarize  # noqa: E402
from specdec_gguf.factory import make_decoder, open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402

ARMS = {"plain": None, "stop": False, "loops": True}  # arm -> follow_loops (None: no drafter)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--set", default="default,short", help="built-in prompt sets, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--remember", action="store_true", help="runs read and write remembered calibrations")
    parser.add_argument("--exact", action="store_true", help="the target in exact mode")
    args = parser.parse_args()
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="specdec-ab-loops-")
    target = open_engine(EngineSettings(model=args.model, n_ctx=2048, n_threads=args.threads, exact=args.exact))
    prompts = [(pid, target.tokenize(text)) for name in args.set.split(",") for pid, _, text in PROMPT_SETS[name]]
    make_decoder(target, DrafterSettings(kind="none")).generate(prompts[0][1], 32, ignore_eog=True)  # warm up
    strategies = [Strategy(arm, DrafterSettings(kind="none" if loops is None else "prompt-lookup"))
                  for arm, loops in ARMS.items()]
    trials = []
    for rep in range(args.repeats):
        for pid, tokens in prompts:
            for strategy, loops in zip(strategies, ARMS.values()):
                decoder = make_decoder(target, strategy.drafter, remember=args.remember)
                if loops is not None:
                    decoder.drafter.follow_loops = loops  # type: ignore[union-attr]
                start_afresh([target])
                result = decoder.generate(tokens, args.n, ignore_eog=True)
                trials.append(Trial(strategy.name, pid, rep, result.stats.generation_throughput, 0.0, 0.0, 0.0,
                                    tuple(result.tokens)))
    reports = {r.name: r for r in summarize(trials, strategies)}
    stop, loops = reports["stop"], reports["loops"]
    for pid, _ in prompts:
        plain = statistics.median(t.throughput for t in trials if t.strategy == "plain" and t.prompt_id == pid)
        print(f"{pid:<16} plain {plain:6.1f} tok/s  "
              + "  ".join(f"{r.name} {r.per_prompt_speedup[pid]:.3f}x{'' if r.same_output[pid] else ' ≠'}"
                          for r in (stop, loops))
              + f"  loops/stop {loops.per_prompt_speedup[pid] / stop.per_prompt_speedup[pid]:.3f}", flush=True)
    print(f"t={args.threads} n={args.n} {args.set} remember={args.remember} exact={args.exact}: geomean stop "
          f"{stop.speedup:.3f}x, loops {loops.speedup:.3f}x, loops/stop {loops.speedup / stop.speedup:.3f}; worst "
          f"stop {min(stop.per_prompt_speedup.values()):.3f}x, loops {min(loops.per_prompt_speedup.values()):.3f}x")

if __name__ == "__main__":
    main()
