"""Per-round cost of running the target in a child interpreter (ProcessEngine) vs in process.

    python benchmarks/ipc_overhead.py [--rounds 2000] [--k 4]

Times greedy verify rounds (forward_argmax over k+1 tokens, then reset) on the tiny
target both ways and prints the difference per round, plus the same for logits rounds
(sampling, rows through shared memory).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def per_round(engine, tokens: list[int], rounds: int, logits: bool) -> float:
    base = engine.n_past
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        (engine.forward_logits if logits else engine.forward_argmax)(tokens)
        engine.reset(base)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    from specdec_gguf.engines import LlamaCppEngine, ProcessEngine
    from specdec_gguf.tiny import write_tiny_family

    family = write_tiny_family(Path(tempfile.mkdtemp()))
    local = LlamaCppEngine(family.target, n_ctx=512)
    remote = ProcessEngine(family.target, python=sys.executable, n_ctx=512)
    prompt = local.tokenize("the model is fast and the draft is")
    for engine in (local, remote):
        engine.advance(prompt)
    tokens = prompt[: args.k + 1]
    for logits in (False, True):
        kind = "logits (sampling)" if logits else "argmax (greedy)"
        per_round(local, tokens, 50, logits), per_round(remote, tokens, 50, logits)  # warm-up
        a = per_round(local, tokens, args.rounds, logits)
        b = per_round(remote, tokens, args.rounds, logits)
        print(f"{kind:18} k={args.k}: in process {a * 1e3:.3f} ms, child process {b * 1e3:.3f} ms, "
              f"overhead {(b - a) * 1e3:.3f} ms per round")
    remote.close()


if __name__ == "__main__":
    main()
