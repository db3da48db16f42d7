"""Adaptive with and without the calibration remembered from earlier runs (calibrations.py), side by side.

Usage:
  python benchmarks/remembered.py --target T.gguf [--draft D.gguf] [--set short] [-t 2] [-n 64]
                                  [--repeats 3] [--k 8]

Strategies, interleaved per prompt (``benchmark.run_trials``: a fresh decoder per trial that prefills
its prompt, as `specdec run` starts): plain,
adaptive reading and writing the store ("with"), adaptive reading nothing ("without"), and any
fixed k given. The store is emptied first, so the first trials of "with" start cold and later ones
from what earlier trials (other prompts) taught it. Prints throughput / plain per prompt and the
geomeans. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.benchmark import Strategy, run_trials, summarize  # noqa: E402
from specdec_gguf.calibrations import store_dir  # noqa: E402
from specdec_gguf.factory import open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402
from matrix import strategies as matrix_strategies  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--draft", type=Path, help="a draft model (default: prompt lookup)")
    ap.add_argument("--set", default="default", choices=sorted(PROMPT_SETS))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, action="append", default=[], help="also a fixed k (repeatable)")
    args = ap.parse_args()

    target = open_engine(EngineSettings(model=args.target, n_ctx=2048, n_threads=args.threads))
    draft = open_engine(EngineSettings(model=args.draft, n_ctx=2048, n_threads=args.threads)) if args.draft else None
    kind = "draft-model" if draft else "prompt-lookup"
    prompts = [(pid, target.tokenize(text)) for pid, _, text in PROMPT_SETS[args.set]]
    shutil.rmtree(store_dir(), ignore_errors=True)
    plain, *fixed = matrix_strategies(kind, list(args.k))[:-1]  # (named as the matrix names them)
    strategies = [plain, Strategy("with", DrafterSettings(kind=kind)),
                  Strategy("without", DrafterSettings(kind=kind), remember=False), *fixed]
    reports = summarize(run_trials(target, draft, strategies, prompts, args.n, args.repeats), strategies)
    for pid, _ in prompts:
        print(f"{pid:<16} " + "  ".join(f"{r.name} {r.per_prompt_speedup[pid]:.2f}x" for r in reports))
    print(f"{'geomean':<16} " + "  ".join(f"{r.name} {r.speedup:.3f}x" for r in reports))
    print(f"{'worst':<16} " + "  ".join(f"{r.name} {min(r.per_prompt_speedup.values()):.2f}x" for r in reports))


if __name__ == "__main__":
    main()
