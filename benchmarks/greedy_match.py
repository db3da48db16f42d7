"""How often greedy speculative output equals plain greedy output on a (quantized) model.

    python benchmarks/greedy_match.py --model MODEL.gguf [--draft DRAFT.gguf] [-n 128]

llama.cpp computes a pass over several tokens with other kernels than a one-token
pass; on quantized weights the logits differ in the last bits and near-ties can flip.
For each built-in prompt and drafter setting this prints whether the outputs are
identical and how many leading tokens agree.
"""

from __future__ import annotations

import argparse

from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engine import common_prefix_length
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.prompts import BENCH_PROMPTS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft")
    parser.add_argument("-n", type=int, default=128)
    args = parser.parse_args()
    target = LlamaCppEngine(args.model, n_ctx=2048)
    draft = LlamaCppEngine(args.draft, n_ctx=2048) if args.draft else None
    settings = [("lookup", k, False) for k in (1, 2, 4, 8, 16)] + [("lookup", 16, True)]
    if draft:
        settings += [("draft", k, False) for k in (1, 2, 4, 8)] + [("draft", 8, True)]
    identical = total = agreed = 0
    for pid, _, text in BENCH_PROMPTS:
        prompt = target.tokenize(text)
        plain = SpeculativeDecoder(target).generate(prompt, args.n, ignore_eog=True).tokens
        row = []
        for kind, k, adaptive in settings:
            drafter = AutoregressiveDrafter(draft) if kind == "draft" else PromptLookupDrafter()
            out = SpeculativeDecoder(target, drafter, num_draft_tokens=k, adaptive=adaptive).generate(
                prompt, args.n, ignore_eog=True).tokens
            same = common_prefix_length(out, plain)
            identical += out == plain
            agreed += same
            total += 1
            row.append(f"{kind}{'-adaptive' if adaptive else ''} k={k}: {'=' if out == plain else same}")
        print(f"{pid:14} " + ", ".join(row))
    print(f"identical outputs: {identical}/{total} ({identical / total:.0%}); "
          f"mean agreeing prefix {agreed / total:.1f} of {args.n} tokens")


if __name__ == "__main__":
    main()
