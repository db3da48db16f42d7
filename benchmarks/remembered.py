"""Adaptive with and without the calibration remembered from earlier runs (calibrations.py), side by side.

Usage:
  python benchmarks/remembered.py --target T.gguf [--draft D.gguf] [--set short] [-t 2] [-n 64]
                                  [--repeats 3] [--k 8]

Strategies, interleaved per prompt, a fresh decoder per trial (as `specdec run` starts): plain,
adaptive reading and writing the store ("with"), adaptive reading nothing ("without"), and any
fixed k given. The store is emptied first, so the first trials of "with" start cold and later ones
from what earlier trials (other prompts) taught it. Prints throughput / plain per prompt and the
geomeans. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.benchmark import geomean  # noqa: E402
from specdec_gguf.calibrations import store_dir  # noqa: E402
from specdec_gguf.factory import make_decoder, open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402


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

    def decoder(name: str):
        if name == "plain":
            return make_decoder(target, DrafterSettings(kind="none"))
        if name.startswith("k="):
            return make_decoder(target, DrafterSettings(kind=kind, num_draft_tokens=int(name[2:]), adaptive=False),
                                draft)
        return make_decoder(target, DrafterSettings(kind=kind), draft, remember=name == "with")

    names = ["plain", "with", "without", *(f"k={k}" for k in args.k)]
    make_decoder(target, DrafterSettings(kind="none")).generate(prompts[0][1], 16, ignore_eog=True)  # warm-up
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for pid, tokens in prompts:
            for name in names:
                stats = decoder(name).generate(tokens, args.n, ignore_eog=True).stats
                seconds.setdefault((pid, name), []).append(stats.generation_seconds)
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for pid, _ in prompts:
        plain = statistics.median(seconds[(pid, "plain")])
        row = {name: plain / statistics.median(seconds[(pid, name)]) for name in names}
        for name, value in row.items():
            ratios[name].append(value)
        print(f"{pid:<16} " + "  ".join(f"{name} {value:.2f}x" for name, value in row.items()))
    print(f"{'geomean':<16} " + "  ".join(f"{name} {geomean(v):.3f}x" for name, v in ratios.items()))
    print(f"{'worst':<16} " + "  ".join(f"{name} {min(v):.2f}x" for name, v in ratios.items()))


if __name__ == "__main__":
    main()
