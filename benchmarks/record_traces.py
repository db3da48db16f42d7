"""Record the target's greedy output for the built-in prompt sets, as traces for policy_sim.py.

Usage: python benchmarks/record_traces.py --model M.gguf [--draft D.gguf] [--set all] [-n 256] [--ignore-eog]
                                         [--name NAME] [--out traces.jsonl]

Timing-free (any machine load is fine): each line holds the prompt ids, the plain greedy
output ids (stopped at end-of-generation, unless ``--ignore-eog`` as the benchmarks do, or -n)
and the vocabulary size; ids are NAME:prompt (NAME: the model file's stem). With ``--draft``,
also the draft model's behaviour teacher-forced over prompt + output, which the simulation's
draft replays (``simulation.Trace``): at each position whether the draft's argmax given all
before it is the target's token ("draft_agree") and the draft's top probability there
("draft_confidence", its bucket's input). That is all a greedy draft's proposals depend on: it
drafts on from the committed context, and tokens after its first wrong one are never verified.
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
from specdec_gguf.simulation import record_draft  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", help="a draft model to record teacher-forced (see above)")
    parser.add_argument("--set", default="all", choices=sorted(PROMPT_SETS))
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--ignore-eog", action="store_true", help="always generate -n tokens")
    parser.add_argument("--name", help="the traces' id prefix (default: the model file's stem)")
    parser.add_argument("--out", type=Path, default=Path("traces.jsonl"),
                        help="the JSONL file to append to (a second set goes beside the first)")
    args = parser.parse_args()
    engine = LlamaCppEngine(args.model, n_ctx=2048, n_threads=args.threads)
    draft = LlamaCppEngine(args.draft, n_ctx=2048, n_threads=args.threads) if args.draft else None
    name = args.name or Path(args.model).stem
    with open(args.out, "a", encoding="utf-8") as out:
        for pid, kind, text in PROMPT_SETS[args.set]:
            prompt = engine.tokenize(text)
            result = SpeculativeDecoder(engine).generate(prompt, args.n, ignore_eog=args.ignore_eog)
            line = {"id": f"{name}:{pid}", "kind": kind, "prompt": prompt, "output": result.tokens,
                    "n_vocab": engine.n_vocab}
            note = ""
            if draft is not None:
                line["draft_agree"], line["draft_confidence"] = record_draft(draft, prompt + result.tokens)
                right = line["draft_agree"][len(prompt):]
                note = f", draft right {sum(right) / max(len(right), 1):.2f} of them"
            out.write(json.dumps(line) + "\n")
            print(f"{pid}: {len(result.tokens)} tokens ({result.stop_reason}){note}", file=sys.stderr)
    engine.close()
    if draft is not None:
        draft.close()


if __name__ == "__main__":
    main()
