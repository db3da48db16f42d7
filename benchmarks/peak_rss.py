"""Peak resident memory of plain vs speculative decoding, each in a fresh process.

    python benchmarks/peak_rss.py --model MODEL.gguf [--draft DRAFT.gguf] [-n 256]

Each mode loads the model(s), generates from the code-edit prompt and reports
ru_maxrss; the speculative modes' peak minus plain's is the extra memory speculation costs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def child(model: str, draft: str | None, mode: str, n: int) -> None:
    from specdec_gguf import SpeculativeDecoder
    from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.prompts import DEMO_PROMPT

    target = LlamaCppEngine(model, n_ctx=2048)
    drafter = None
    if mode == "lookup":
        drafter = PromptLookupDrafter()
    elif mode == "draft":
        drafter = AutoregressiveDrafter(LlamaCppEngine(draft, n_ctx=2048))
    decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=16, adaptive=True)
    for _ in range(3):
        decoder.generate(target.tokenize(DEMO_PROMPT), n, ignore_eog=True)
    print(json.dumps({"mode": mode, "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft")
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.model, args.draft, args.child, args.n)
        return
    modes = ["plain", "lookup"] + (["draft"] if args.draft else [])
    results = {}
    for mode in modes:
        cmd = [sys.executable, __file__, "--model", args.model, "-n", str(args.n), "--child", mode]
        if args.draft:
            cmd += ["--draft", args.draft]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])["max_rss_mib"]
    for mode, rss in results.items():
        print(f"{mode:7} peak RSS {rss:8.1f} MiB  ({rss - results['plain']:+.1f} MiB vs plain)")


if __name__ == "__main__":
    main()
