"""How often greedy speculative output equals plain greedy output, in default and in exact mode.

    python benchmarks/greedy_match.py --model MODEL.gguf [--draft DRAFT.gguf] [-n 128] [--k 1,2,4,8,16]
        [--set default] [--mode default|exact|both] [--python PY] [--peer-bin llama-speculative-simple]

The default llama.cpp build computes a pass over several tokens with other kernels
than a one-token pass, so the logits differ in the last bits and near-ties can flip.
For each built-in prompt (``--set``: the sets named, comma-separated) and drafter setting
(prompt lookup and, with --draft, the draft model; each fixed ``--k`` and adaptive) this
prints whether the speculative output is identical to plain decoding's and how many leading
tokens agree. Exact mode loads the target with exact mode's settings and prints the self-test's verdict first
(docs/exactness.md); ``--python`` runs that target in another interpreter, e.g. a venv
with a GGML_LLAMAFILE=OFF build. The draft model always runs in this process.
``--peer-bin`` adds llama.cpp's native n-gram modes (``llama-speculative-simple``, in exact mode with
exact mode's settings: ``LlamaCppPeer(exact=True)``): whether the answer each printed is plain
decoding's text, or after how many characters it differs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter, PromptLookupDrafter
from specdec_gguf.engine import common_prefix_length
from specdec_gguf.factory import open_engine
from specdec_gguf.peers import NGRAM_MODES, LlamaCppPeer
from specdec_gguf.prompts import PROMPT_SETS
from specdec_gguf.settings import EngineSettings


def peer_verdict(peer: LlamaCppPeer, text: str, plain: str, n: int) -> tuple[bool, str]:
    """Whether the peer's answer to ``text`` is ``plain`` (the text of plain decoding's n tokens), and its mark."""
    answer = peer.run(text, n).answer(text)
    if answer is None:
        return False, "prompt not echoed"
    if answer.startswith(plain):  # (the peer prints its own line ends after the answer)
        return True, "="
    return False, f"differs after {len(os.path.commonprefix([answer, plain]))} chars"


def identity(target, draft, n: int, peers: list[LlamaCppPeer] = (), ks: tuple[int, ...] = (1, 2, 4, 8, 16),
             prompts: list[tuple[str, str, str]] = PROMPT_SETS["default"]) -> tuple[int, int, int, int, int]:
    """Print one line per prompt; return (identical runs, runs, agreeing tokens, identical peer answers,
    peer answers)."""
    settings = [("lookup", k, False) for k in ks] + [("lookup", max(ks), True)]
    if draft:
        settings += [("draft", k, False) for k in ks] + [("draft", 8, True)]
    identical = total = agreed = peers_same = peers_run = 0
    for pid, _, text in prompts:
        prompt = target.tokenize(text)
        plain = SpeculativeDecoder(target).generate(prompt, n, ignore_eog=True).tokens
        row = []
        plain_text = target.detokenize(plain) if peers else ""
        for peer in peers:
            same, mark = peer_verdict(peer, text, plain_text, n)
            peers_same += same
            peers_run += 1
            row.append(f"{peer.name}: {mark}")
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
    return identical, total, agreed, peers_same, peers_run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--mode", choices=("default", "exact", "both"), default="both")
    parser.add_argument("--python", help="Run the exact-mode target in this interpreter (another llama.cpp build).")
    parser.add_argument("--peer-bin", help="llama.cpp's llama-speculative-simple: compare its n-gram modes' answers too.")
    parser.add_argument("-t", "--threads", type=int, help="Threads for the target and the peers (default: llama.cpp's).")
    parser.add_argument("--k", default="1,2,4,8,16",
                        help="fixed k to run (comma-separated); adaptive prompt lookup may verify up to the largest")
    parser.add_argument("--set", default="default", help="built-in prompt sets (comma-separated)")
    args = parser.parse_args()
    ks = tuple(int(k) for k in args.k.split(","))
    prompts = [p for name in args.set.split(",") for p in PROMPT_SETS[name]]
    draft = open_engine(EngineSettings(model=args.draft, n_ctx=2048)) if args.draft else None
    summary = []
    for mode in (("default", "exact") if args.mode == "both" else (args.mode,)):
        exact = mode == "exact"
        target = open_engine(EngineSettings(model=args.model, n_ctx=2048, n_threads=args.threads,
                                            exact="warn" if exact else False, python=args.python if exact else None))
        print(f"{mode} mode" + (f" ({target.exactness.summary()})" if target.exactness else ""), flush=True)
        peers = [LlamaCppPeer(Path(args.peer_bin), Path(args.model), m, threads=args.threads, exact=exact)
                 for m in NGRAM_MODES] if args.peer_bin else []
        try:
            identical, total, agreed, peers_same, peers_run = identity(target, draft, args.n, peers, ks, prompts)
        finally:
            target.close()
        summary.append(f"{mode} mode: identical outputs {identical}/{total} ({identical / total:.0%}); "
                       f"mean agreeing prefix {agreed / total:.1f} of {args.n} tokens"
                       + (f"; llama.cpp's answers plain decoding's {peers_same}/{peers_run}" if peers else ""))
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
