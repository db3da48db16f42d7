"""Soak: generate 20,000 tokens with speculative decoding on a tiny model; resident memory must stay flat.

    python benchmarks/soak.py [--tokens 20000] [--chunk 500]

Prints RSS after warm-up and at every checkpoint, and the drift in percent.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=500, help="tokens per generate call")
    args = parser.parse_args()

    from specdec_gguf import SamplingParams, SpeculativeDecoder
    from specdec_gguf.drafters import AutoregressiveDrafter
    from specdec_gguf.engines import LlamaCppEngine
    from specdec_gguf.tiny import write_tiny_family

    family = write_tiny_family(Path(tempfile.mkdtemp()), seed=1)
    target = LlamaCppEngine(family.target, n_ctx=1024)
    draft = LlamaCppEngine(family.draft, n_ctx=1024)
    decoder = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=6, adaptive=True)
    prompt = target.tokenize("the model is fast and the draft is")
    params = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95, seed=3)]
    for _ in range(4):  # warm-up: allocators, caches, schedule
        decoder.generate(prompt, args.chunk, params[0])
    base = rss_mib()
    print(f"after warm-up: RSS {base:.1f} MiB")
    done, i, peak, start = 0, 0, base, time.perf_counter()
    while done < args.tokens:
        result = decoder.generate(prompt, args.chunk, params[i % 2])
        done += len(result.tokens)
        i += 1
        rss = rss_mib()
        peak = max(peak, rss)
        if i % 8 == 0:
            print(f"{done:>6} tokens: RSS {rss:.1f} MiB ({(rss - base) / base:+.2%})")
    final = rss_mib()
    print(f"generated {done} tokens in {time.perf_counter() - start:.1f} s; RSS after warm-up {base:.1f} MiB, "
          f"peak {peak:.1f} MiB, final {final:.1f} MiB, drift {(final - base) / base:+.2%}, "
          f"peak drift {(peak - base) / base:+.2%}")


if __name__ == "__main__":
    main()
