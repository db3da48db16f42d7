"""Throughput and Python share (time outside llama_decode) of sampled decoding on one model.

    python benchmarks/sampling_overhead.py --model MODEL.gguf [-n 128]

Plain decoding and adaptive prompt lookup on the code-edit prompt, greedy and with
temperature / top-p / top-k sampling.
"""

from __future__ import annotations

import argparse

from specdec_gguf import SamplingParams, SpeculativeDecoder
from specdec_gguf.drafters import PromptLookupDrafter
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.prompts import BENCH_PROMPTS

SETTINGS = [("greedy", SamplingParams()), ("temp 0.8", SamplingParams(temperature=0.8, seed=1)),
            ("temp 0.8, top-p 0.95", SamplingParams(temperature=0.8, top_p=0.95, seed=1)),
            ("temp 0.8, top-k 40", SamplingParams(temperature=0.8, top_k=40, seed=1))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("-n", type=int, default=128)
    args = parser.parse_args()
    target = LlamaCppEngine(args.model, n_ctx=2048)
    prompt = target.tokenize(BENCH_PROMPTS[0][2])
    for name, params in SETTINGS:
        for label, decoder in (("plain", SpeculativeDecoder(target)),
                               ("lookup adaptive", SpeculativeDecoder(target, PromptLookupDrafter(),
                                                                      num_draft_tokens=16, adaptive=True))):
            decoder.generate(prompt, 32, params, ignore_eog=True)  # warm-up
            before = target.decode_seconds
            result = decoder.generate(prompt, args.n, params, ignore_eog=True)
            in_llama = target.decode_seconds - before - result.stats.prefill_seconds
            share = 1 - in_llama / result.stats.generation_seconds
            print(f"{name:22} {label:16} {result.stats.generation_throughput:6.1f} tok/s  "
                  f"Python share {share:5.1%}  tokens/pass {result.stats.tokens_per_target_pass:.2f}")


if __name__ == "__main__":
    main()
