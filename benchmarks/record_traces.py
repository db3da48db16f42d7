"""Record the target's greedy output for the built-in prompt sets, as traces for policy_sim.py.

Usage: python benchmarks/record_traces.py --model M.gguf [--set all] [-n 256] [--out traces.jsonl]

Timing-free (any machine load is fine): each line holds the prompt ids, the plain greedy
output ids (stopped at end-of-generation or -n) and the vocabulary size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf import SpeculativeDecoder  # noqa: E402
from specdec_gguf.engines import LlamaCppEngine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--set", default="all", choices=sorted(PROMPT_SETS))
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("traces.jsonl"))
    args = parser.parse_args()
    engine = LlamaCppEngine(args.model, n_ctx=2048, n_threads=args.threads)
    name = Path(args.model).stem
    with open(args.out, "a", encoding="utf-8") as out:
        for pid, kind, text in PROMPT_SETS[args.set]:
            prompt = engine.tokenize(text)
            result = SpeculativeDecoder(engine).generate(prompt, args.n)
            out.write(json.dumps({"id": f"{name}:{pid}", "kind": kind, "prompt": prompt, "output": result.tokens,
                                  "n_vocab": engine.n_vocab}) + "\n")
            print(f"{pid}: {len(result.tokens)} tokens ({result.stop_reason})", file=sys.stderr)
    engine.close()


if __name__ == "__main__":
    main()
