"""The price of exact mode: plain, speculative and prefill tok/s, default vs exact, interleaved.

    python benchmarks/exact_price.py --model MODEL.gguf --exact-python ~/venvs/exact/bin/python \
        [--also patched=~/venvs/patched/bin/python] [-n 128] [--repeats 3] [-t 2]

Both targets run in child interpreters (``ProcessEngine``), so both pay the same pipe
overhead and differ only in llama.cpp build and settings: "default" is this
interpreter's build with default settings, "exact" is ``--exact-python``'s build in exact
mode (``--also`` adds more exact-mode builds, e.g. one with the llamafile patch of
docs/exactness.md). Trials interleave the modes (prompt by prompt, repeat by repeat) on
the built-in prompts; speculative = adaptive prompt lookup (k <= 16); prefill = the
first 512 tokens of all prompts, one ``advance``. Prints medians and exact/default ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import PromptLookupDrafter
from specdec_gguf.engines import ProcessEngine
from specdec_gguf.prompts import BENCH_PROMPTS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--exact-python", required=True)
    parser.add_argument("--also", action="append", default=[], help="LABEL=PYTHON: another exact-mode build.")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int)
    args = parser.parse_args()
    builds = [("default", sys.executable, False), ("exact", args.exact_python, True)]
    builds += [(label, python, True) for label, python in (a.split("=", 1) for a in args.also)]
    engines = {label: ProcessEngine(args.model, python=python, n_ctx=2048, n_threads=args.threads,
                                    exact="warn" if exact else False) for label, python, exact in builds}
    for label, engine in engines.items():
        print(f"{label}: {engine.python}" + (f" ({engine.exactness.summary()})" if engine.exactness else ""))
    prompts = [engines["default"].tokenize(text) for _, _, text in BENCH_PROMPTS]
    long_prompt = [t for p in prompts for t in p][:512]
    rates: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for label, engine in engines.items():  # interleaved: each prompt meets every build in turn
                engine.reset(0)
                t0 = time.perf_counter()
                engine.advance(long_prompt)
                rates.setdefault((label, "prefill"), []).append(len(long_prompt) / (time.perf_counter() - t0))
                engine.reset(0)
                for kind, drafter in (("plain", None), ("speculative", PromptLookupDrafter())):
                    decoder = SpeculativeDecoder(engine, drafter, num_draft_tokens=16, adaptive=True)
                    result = decoder.generate(prompt, args.n, ignore_eog=True)
                    rates.setdefault((label, kind), []).append(result.stats.generation_throughput)
        print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
    print("\n| build | plain tok/s | speculative tok/s | prefill tok/s |\n| --- | --- | --- | --- |")
    base = {kind: statistics.median(rates["default", kind]) for kind in ("plain", "speculative", "prefill")}
    for label in engines:
        cells = []
        for kind in ("plain", "speculative", "prefill"):
            median = statistics.median(rates[label, kind])
            cells.append(f"{median:.1f}" + ("" if label == "default" else f" ({median / base[kind]:.2f}x)"))
        print(f"| {label} | " + " | ".join(cells) + " |")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
