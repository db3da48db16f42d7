"""How often greedy speculative output equals plain greedy output, in default and in exact mode.

    python benchmarks/greedy_match.py --model MODEL.gguf [--draft DRAFT.gguf] [-n 128]
        [--mode default|exact|both] [--python PY]

The default llama.cpp build computes a pass over several tokens with other kernels
than a one-token pass, so the logits differ in the last bits and near-ties can flip.
For each built-in prompt and drafter setting (prompt lookup and, with --draft, the
draft model; fixed k 1-16 and adaptive) this prints whether the speculative output is
identical to plain decoding's and how many leading tokens agree. Exact mode loads the
target with exact mode's settings and prints the self-test's verdict first
(docs/exactness.md); ``--python`` runs that target in another interpreter, e.g. a venv
with a GGML_LLAMAFILE=OFF build. The draft model always runs in this process.
"""

from __future__ import annotations

import argparse

from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engine import common_prefix_length
from specdec_gguf.factory import open_engine
from specdec_gguf.prompts import BENCH_PROMPTS
from specdec_gguf.settings import EngineSettings

KS = (1, 2, 4, 8, 16)


def identity(target, draft, n: int) -> tuple[int, int, int]:
    """Print one line per prompt; return (identical runs, runs, agreeing tokens)."""
    settings = [("lookup", k, False) for k in KS] + [("lookup", 16, True)]
    if draft:
        settings += [("draft", k, False) for k in KS] + [("draft", 8, True)]
    identical = total = agreed = 0
    for pid, _, text in BENCH_PROMPTS:
        prompt = target.tokenize(text)
        plain = SpeculativeDecoder(target).generate(prompt, n, ignore_eog=True).tokens
        row = []
        for kind, k, adaptive in settings:
            drafter = AutoregressiveDrafter(draft) if kind == "draft" else PromptLookupDrafter()
            out = SpeculativeDecoder(target, drafter, num_draft_tokens=k, adaptive=adaptive).generate(
                prompt, n, ignore_eog=True).tokens
            same = common_prefix_length(out, plain)
            identical += out == plain
            agreed += same
            total += 1
            row.append(f"{kind}{'-adaptive' if adaptive else ''} k={k}: {'=' if out == plain else same}")
        print(f"  {pid:14} " + ", ".join(row), flush=True)
    return identical, total, agreed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--mode", choices=("default", "exact", "both"), default="both")
    parser.add_argument("--python", help="Run the exact-mode target in this interpreter (another llama.cpp build).")
    args = parser.parse_args()
    draft = open_engine(EngineSettings(model=args.draft, n_ctx=2048)) if args.draft else None
    summary = []
    for mode in (("default", "exact") if args.mode == "both" else (args.mode,)):
        exact = mode == "exact"
        target = open_engine(EngineSettings(model=args.model, n_ctx=2048, exact="warn" if exact else False,
                                            python=args.python if exact else None))
        print(f"{mode} mode" + (f" ({target.exactness.summary()})" if target.exactness else ""), flush=True)
        try:
            identical, total, agreed = identity(target, draft, args.n)
        finally:
            target.close()
        summary.append(f"{mode} mode: identical outputs {identical}/{total} ({identical / total:.0%}); "
                       f"mean agreeing prefix {agreed / total:.1f} of {args.n} tokens")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
