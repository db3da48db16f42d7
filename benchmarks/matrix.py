"""The "never loses" matrix: cold runs on models, cost ratios, answer lengths and thread counts nobody tuned on.

Usage:
  python benchmarks/matrix.py --gemma $G [--threads 1,2] [-n 64,256] [--repeats 3] [--peer-bin PATH] [--out m.json]
                              [--exact]
                             [--temp 0.8]  (sampled: every strategy samples; llama.cpp's peers, greedy only, are left out)

Cases (each: plain, fixed k, adaptive; a fresh decoder per trial, as `specdec run`):
- tiny F32 pair (4-layer d64 target, 1-layer draft): per-call costs dominate, nothing pays;
- tiny wide pair (8-layer d512 F32 target, 1-layer draft agreeing closely): a cheap draft that pays;
- tiny mid pair (6-layer d256 Q8_0, 2-layer draft, weaker agreement);
- tiny big pair (12-layer d1024 Q8_0 target, 165 MB, 18 ms a token on 2 cores; 1-layer draft, 70-85%
  accepted): a target whose passes are dominated by its weights, as a real model's are;
- Gemma 3 270M with prompt lookup on short chat-like answers, the default set, the held-out set (prompts no
  constant was tuned on) and long grounded rewrites;
- Gemma 3 270M requantized (``gemma-f16``, ``gemma-q8_0``: the same answers' kind on other cost curves; at
  1 thread a 2-token pass costs 2.9 and 3.2 one-token passes, against Q4_K_M's 2.4), with prompt lookup on
  the short and default sets;
- a real draft-model pair, ``gemma-f16-draft``: the F16 target drafted by the Q4_K_M original, which
  agrees with it on most tokens but costs 0.65-0.8 of its pass: drafting hardly pays, so it must not lose;
- ``gemma-l12-draft``: Gemma drafted by its own first 12 blocks (benchmarks/layer_draft.py), on the short set: a
  trained draft that agrees on 40%-95% of tokens at 0.8-0.9 of a target pass, where no fixed k pays.
- ``tiny-deep-q4k`` and ``tiny-deep24-q4k`` (only when named): the issue's two draft pairs, a 16-layer d2048 Q4_K_M
  target (~0.8B parameters, 474 MB) whose 2-layer draft agrees on 84% of first tokens (drafting pays), and a
  24-layer d1024 one (178 MB) whose 2-layer draft agrees on ~55% (it barely does); ``tiny-gqa24-q4k`` (only when
  named) is the latter's twin with grouped-query attention (2 key/value heads), the shape of most small released models;
  ``tiny-gqa12-q4k`` (only when named, added after the schedule's constants were last tuned): a 12-layer d1536 Q4_K_M
  target with 4 key/value heads (183 MB) whose 1-layer draft agrees on ~75% of first tokens, where drafting pays at 1
  or 2 drafted tokens.
Cases are named in ``--only``: tiny-f32, tiny-wide, tiny-mid-q8, tiny-big-q8, tiny-deep-q4k, tiny-deep24-q4k, tiny-gqa24-q4k,
tiny-gqa12-q4k,
gemma, gemma-f16, gemma-q8_0,
gemma-f16-draft, gemma-l12-draft (the requantized ones and the layer draft are written from ``--gemma`` into a
temporary folder, ~4 s).
Prints adaptive / plain per prompt (the bound: >= 0.97x everywhere) and adaptive / best fixed k.
Run it on an otherwise idle machine: two busy cores ruin the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf import SamplingParams  # noqa: E402
from specdec_gguf.benchmark import Strategy, geomean, run_peer_trials, run_trials, summarize  # noqa: E402
from specdec_gguf.errors import EngineError  # noqa: E402
from specdec_gguf.peers import NGRAM_MODES, LlamaCppPeer  # noqa: E402
from specdec_gguf.engines.llama_cpp import requantize  # noqa: E402
from specdec_gguf.factory import open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402
from specdec_gguf.tiny import TinyFamily, TinyShape, write_tiny_family  # noqa: E402
from layer_draft import GEMMA_DRAFT_BLOCKS, write_layer_draft  # noqa: E402

TINY = {  # name: (target layers, draft layers, gain, shape, dtype)
    "tiny-f32": (4, 1, 0.25, TinyShape(), "f32"),
    "tiny-wide": (8, 1, 0.04, TinyShape(n_embd=512, n_head=8, n_ff=1536), "f32"),
    "tiny-mid-q8": (6, 2, 0.3, TinyShape(n_embd=256, n_head=4, n_ff=768), "q8_0"),
    "tiny-big-q8": (12, 1, 0.06, TinyShape(n_embd=1024, n_head=16, n_ff=2816), "q8_0"),
    # The issue's own "drafting pays" pair: ~0.8B parameters in 16 d2048 layers at Q4_K_M (written as Q8_0, then
    # requantized), drafted by its first 2 layers; not in the default run (writing it takes about a minute).
    "tiny-deep-q4k": (16, 2, 0.05, TinyShape(n_embd=2048, n_head=16, n_ff=5632), "q4_k_m"),
    # The other draft pair: a 24-layer Q4_K_M target whose 2-layer draft agrees only ~55% of the time.
    "tiny-deep24-q4k": (24, 2, 0.16, TinyShape(n_embd=1024, n_head=16, n_ff=2816), "q4_k_m"),
    # Its twin with grouped-query attention (2 key/value heads of 64 for 16 query heads, as Qwen2.5 0.5B's 2 for
    # 14): the shape most small released models have, where attention over the cache costs far less.
    "tiny-gqa24-q4k": (24, 2, 0.16, TinyShape(n_embd=1024, n_head=16, n_ff=2816, n_head_kv=2), "q4_k_m"),
    # A pair nobody tuned on (added in the forty-first session): wider, shallower, 4 key/value heads, a 1-layer draft
    # agreeing on ~75% of first tokens; drafting pays a little (best at 1-2 drafted tokens), so the schedule's
    # marginal decisions are what it tests.
    "tiny-gqa12-q4k": (12, 1, 0.08, TinyShape(n_embd=1536, n_head=12, n_ff=4096, n_head_kv=4), "q4_k_m"),
}
DEFAULT_TINY = ("tiny-f32", "tiny-wide", "tiny-mid-q8", "tiny-big-q8")

# Gemma 3 270M requantized from --gemma: (case, file type, drafter).
REQUANTIZED = (("gemma-f16", "f16", "prompt-lookup"), ("gemma-q8_0", "q8_0", "prompt-lookup"),
               ("gemma-f16-draft", "f16", "draft-model"))


def write_case(name: str, folder: Path) -> TinyFamily:
    """Write the tiny family ``name`` of TINY into ``folder`` (its target and draft GGUF files)."""
    layers, draft_layers, gain, shape, dtype = TINY[name]
    if dtype != "q4_k_m":
        return write_tiny_family(folder, target_layers=layers, draft_layers=draft_layers, gain=gain, shape=shape,
                                 dtype=dtype)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as staging:  # (the Q8_0 pair, gone once requantized)
        q8 = write_tiny_family(staging, target_layers=layers, draft_layers=draft_layers, gain=gain, shape=shape,
                               dtype="q8_0")
        return TinyFamily(target=requantize(q8.target, folder / "tiny-target.gguf", "q4_k_m"),
                          draft=requantize(q8.draft, folder / "tiny-draft.gguf", "q4_k_m"))


def strategies(kind: str, ks: list[int]) -> list[Strategy]:
    short = "draft" if kind == "draft-model" else "lookup"
    return ([Strategy("plain", DrafterSettings(kind="none"))]
            + [Strategy(f"{short} k={k}", DrafterSettings(kind=kind, num_draft_tokens=k, adaptive=False)) for k in ks]
            + [Strategy(f"{short} adaptive", DrafterSettings(kind=kind))])  # type: ignore[arg-type]


def run_case(name: str, target_path: Path, draft_path: Path | None, kind: str, prompt_set: str, n: int,
             threads: int, repeats: int, peers: list, sampling: SamplingParams = SamplingParams(),
             exact: bool = False) -> dict:
    ks = [1, 2, 4, 8] + ([16] if kind == "prompt-lookup" else [])
    target = open_engine(EngineSettings(model=target_path, n_ctx=2048, n_threads=threads, exact=exact))
    draft = open_engine(EngineSettings(model=draft_path, n_ctx=2048, n_threads=threads)) if draft_path else None
    prompts = [(pid, text) for pid, _, text in PROMPT_SETS[prompt_set]]
    try:
        tokenized = [(pid, target.tokenize(text)) for pid, text in prompts]
        strats = strategies(kind, ks)
        trials = run_trials(target, draft, strats, tokenized, n, repeats, sampling, cold=True)
    finally:
        for e in (draft, target):
            if e is not None:
                e.close()
    texts = dict(prompts)
    ran = []  # the peers that reported on this case
    for peer in peers:
        try:
            trials += run_peer_trials(peer.name, lambda pid, toks, p=peer: p.run(texts[pid], n).throughput,
                                      tokenized, repeats)
        except EngineError as err:  # a peer that fails on one case must not cost the whole matrix
            print(f"  ({name}, n={n}, t={threads}: {peer.name} left out: {err})", flush=True)
            continue
        ran.append(peer)
        strats.append(Strategy(peer.name, DrafterSettings(kind=kind), peer=True))  # type: ignore[arg-type]
    reports = {r.name: r for r in summarize(trials, strats, greedy=sampling.greedy)}
    adaptive = reports[strats[len(ks) + 1].name]
    row = {"case": name, "kind": kind, "set": prompt_set, "n": n, "threads": threads,
           "temperature": sampling.temperature,
           "adaptive_vs_plain": adaptive.per_prompt_speedup, "adaptive_geomean": adaptive.speedup,
           "vs_best_fixed": adaptive.vs_best_fixed, "vs_best_fixed_geomean": adaptive.vs_best_fixed_geomean,
           "plain_tok_s": reports["plain"].median_throughput,
           # greedy: per prompt, whether every adaptive trial wrote plain decoding's answer (a long pass on
           # the default build can tip a near-tie, and a different answer copies more or less)
           "adaptive_same_output": adaptive.same_output,
           "peers": {p.name: {pid: adaptive.per_prompt_speedup[pid] / reports[p.name].per_prompt_speedup[pid]
                              for pid in adaptive.per_prompt_speedup if reports[p.name].per_prompt_speedup.get(pid)}
                     for p in ran}}
    worst = min(row["adaptive_vs_plain"].values())
    differed = [pid for pid, same in adaptive.same_output.items() if not same]
    print(f"{name:<12} {kind:<13} {prompt_set:<8} n={n:<4} t={threads}  plain {row['plain_tok_s']:7.1f} tok/s  "
          f"adaptive/plain {adaptive.speedup:.2f}x (worst {worst:.2f}x)  "
          f"vs best fixed {adaptive.vs_best_fixed_geomean or 0:.2f}x"
          + "".join(f"  vs {p}: {geomean(list(v.values())):.2f}x" for p, v in row["peers"].items())
          + (f"  (≠ plain's answer: {', '.join(differed)})" if differed else ""), flush=True)
    return row


def lookup_rows(name: str, model: Path, plan: list[tuple[str, int]], threads: list[int], repeats: int,
                peer_bin: Path | None, sampling: SamplingParams, exact: bool = False) -> list[dict]:
    """Prompt lookup on a real model: a row per thread count and (prompt set, tokens) of ``plan``, with
    llama.cpp's n-gram modes as peers except on the short set (chat answers: the tables compare them on
    grounded prompts)."""
    rows = []
    for t in threads:
        for prompt_set, n in plan:
            peers = [LlamaCppPeer(peer_bin, model, mode, threads=t, exact=exact) for mode in NGRAM_MODES] \
                if peer_bin and prompt_set != "short" else []
            rows.append(run_case(name, model, None, "prompt-lookup", prompt_set, n, t, repeats, peers, sampling,
                                 exact=exact))
    return rows


def draft_rows(name: str, target: Path, draft: Path, prompt_set: str, n: int, threads: list[int], repeats: int,
               peer_bin: Path | None, sampling: SamplingParams, exact: bool = False) -> list[dict]:
    """A real draft-model pair's case at each thread count, llama.cpp's draft-simple beside it (given its binary)."""
    rows = []
    for t in threads:
        peers = [LlamaCppPeer(peer_bin, target, "draft-simple", draft=draft, threads=t, draft_max=8,
                              exact=exact)] if peer_bin else []
        rows.append(run_case(name, target, draft, "draft-model", prompt_set, n, t, repeats, peers, sampling,
                             exact=exact))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gemma", type=Path, help="Gemma 3 270M GGUF (skip Gemma cases without it)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("-n", default="64,256")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peer-bin", type=Path, help="llama-speculative-simple, to add llama.cpp's own modes")
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--out", type=Path, default=Path("matrix.json"))
    parser.add_argument("--temp", type=float, default=0.0, help="sample at this temperature (0: greedy)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed of the first repeat, seed + r of repeat r (default: fresh draws per trial)")
    parser.add_argument("--exact", action="store_true",
                        help="targets (and llama.cpp's peers) in exact mode: every answer plain decoding's on a "
                             "bit-invariant build (GGML_LLAMAFILE=OFF, docs/exactness.md)")
    args = parser.parse_args()
    sampling = SamplingParams(temperature=args.temp, seed=args.seed)
    peer_bin = args.peer_bin if sampling.greedy else None  # (llama.cpp's peers decode greedily)
    threads = [int(t) for t in args.threads.split(",")]
    lengths = [int(x) for x in args.n.split(",")]
    only = set(args.only.split(",")) if args.only else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="specdec-matrix-") as tmp:
        for name in TINY:
            if name not in (only or DEFAULT_TINY):
                continue
            family = write_case(name, Path(tmp) / name)
            for t in threads:
                for n in lengths:
                    peers = []
                    if peer_bin:
                        peers = [LlamaCppPeer(peer_bin, family.target, "draft-simple", draft=family.draft,
                                              threads=t, draft_max=8, exact=args.exact)]
                    rows.append(run_case(name, family.target, family.draft, "draft-model", "default", n, t,
                                         args.repeats, peers, sampling, exact=args.exact))
                    rows.append(run_case(name, family.target, None, "prompt-lookup", "default", n, t,
                                         args.repeats, [], sampling, exact=args.exact))
        if args.gemma and (not only or "gemma" in only):
            rows += lookup_rows("gemma", args.gemma, [("short", lengths[0]), ("default", lengths[0]),
                                                      ("heldout", lengths[0]), ("long", lengths[-1]),
                                                      ("default", lengths[-1])],
                                threads, args.repeats, peer_bin, sampling, exact=args.exact)
        # Gemma at other quantizations: the same kind of answers on cost curves nobody tuned on.
        for name, file_type, kind in REQUANTIZED:
            if not args.gemma or (only and name not in only):
                continue
            variant = Path(tmp) / f"gemma-{file_type}.gguf"
            if not variant.exists():
                requantize(args.gemma, variant, file_type)
            if kind == "prompt-lookup":
                rows += lookup_rows(name, variant, [("short", lengths[0]), ("default", lengths[0]),
                                                    ("default", lengths[-1])], threads, args.repeats, peer_bin, sampling,
                                    exact=args.exact)
                continue
            # (the original Q4_K_M drafts for its F16 requantization)
            rows += draft_rows(name, variant, args.gemma, "default", lengths[0], threads, args.repeats, peer_bin,
                               sampling, exact=args.exact)
        if args.gemma and (not only or "gemma-l12-draft" in only):  # (Gemma drafted by its own first blocks)
            draft = write_layer_draft(args.gemma, Path(tmp) / "gemma-layer-draft.gguf", GEMMA_DRAFT_BLOCKS)
            rows += draft_rows("gemma-l12-draft", args.gemma, draft, "short", lengths[0], threads, args.repeats,
                               peer_bin, sampling, exact=args.exact)
    args.out.write_text(json.dumps(rows, indent=1))
    worst = min((v, r["case"], r["set"], r["n"], r["threads"], pid) for r in rows
                for pid, v in r["adaptive_vs_plain"].items())
    print(f"worst adaptive/plain over every prompt of every case: {worst[0]:.3f} {worst[1:]}")


if __name__ == "__main__":
    main()
