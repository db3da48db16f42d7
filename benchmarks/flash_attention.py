"""Flash attention on against off, plain decoding and the adaptive schedule, per prompt, side by side.

Usage:
  python benchmarks/flash_attention.py CASE [--draft D.gguf] [--kind prompt-lookup|draft-model] [--threads 2]
                                       [-n 64] [--repeats 3] [--set default]
  python benchmarks/flash_attention.py MODEL.gguf --curve [--threads 2]

CASE: a tiny family of benchmarks/matrix.py (written to a temporary folder) or a target GGUF path (``--draft``
for its draft model). Opens the target (and draft) twice, once with ``flash_attn="on"`` and once with
``"off"``, and answers every prompt of ``--set`` with plain decoding and with the adaptive schedule on each,
a fresh decoder per answer (as `specdec run` starts), the two settings' answers interleaved and their order
alternating by repeat. Prints per prompt its length in tokens, the median milliseconds an answer (generation
only, not the prefill) for each setting and decoding, on over off (above 1: off is faster), and each setting's
adaptive speed-up over its own plain decoding; then what ``flash_attn="auto"`` chooses for this target
(``LlamaCppEngine.attention``: timed once per model, threads and build, cached). Greedy output may differ
between the settings (their sums round differently), not within one. Run it on an otherwise idle machine.

``--curve``: only the passes themselves — one pass over n = 1, 2, 5, 9, 17 tokens after 16, 128, 350 and 1000
tokens of context, each setting (the fastest of 4; no logits, so the output layer's share is left out).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_constants import case_arguments, case_models  # noqa: E402

from specdec_gguf.benchmark import start_afresh  # noqa: E402
from specdec_gguf.factory import make_decoder, open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402

SETTINGS = ("on", "off")
DECODINGS = ("plain", "adaptive")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    case_arguments(parser, "prompt-lookup")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", default="default", choices=list(PROMPT_SETS), help="built-in prompts")
    parser.add_argument("--curve", action="store_true", help="time the passes only (see above)")
    args = parser.parse_args()
    if args.repeats < 1 or args.n < 1:
        raise SystemExit(f"--repeats={args.repeats} and -n={args.n} must be >= 1")
    if args.curve:
        curve(Path(args.case), args.threads)
        return
    with tempfile.TemporaryDirectory() as tmp:
        target_path, draft_path = case_models(args, Path(tmp))
        engines = {}
        for setting in SETTINGS:
            target = open_engine(EngineSettings(model=target_path, n_ctx=2048, n_threads=args.threads, flash_attn=setting))
            draft = open_engine(EngineSettings(model=draft_path, n_ctx=2048, n_threads=args.threads, flash_attn=setting)) \
                if args.kind == "draft-model" else None
            engines[setting] = (target, draft)
        try:
            ms = run(args, engines)
            prompts = {pid: len(engines["on"][0].tokenize(text)) for pid, _, text in PROMPT_SETS[args.set]}
        finally:
            for pair in engines.values():
                for engine in pair:
                    if engine is not None:
                        engine.close()
        auto = open_engine(EngineSettings(model=target_path, n_ctx=2048, n_threads=args.threads))
        choice = auto.attention
        auto.close()
    print(f"{args.case}, {args.kind}, '{args.set}' prompts, {args.threads} thread(s), {args.n} tokens, "
          f"{args.repeats} repeats: median ms an answer; on / off above 1: off is faster")
    print(f"  {'prompt':<16}{'tokens':>6}  {'plain on':>9} {'off':>8} {'on/off':>7}  {'adaptive on':>11} {'off':>8} "
          f"{'on/off':>7}  {'speed-up on':>11} {'off':>6}")
    for pid, tokens in prompts.items():
        m = {key: statistics.median(values) for key, values in ms.items() if key[2] == pid}
        p_on, p_off, a_on, a_off = (m[(s, d, pid)] for d in DECODINGS for s in SETTINGS)
        print(f"  {pid:<16}{tokens:>6}  {p_on:>9.2f} {p_off:>8.2f} {p_on / p_off:>6.2f}x  {a_on:>11.2f} {a_off:>8.2f} "
              f"{a_on / a_off:>6.2f}x  {p_on / a_on:>10.2f}x {p_off / a_off:>5.2f}x")
    print(f"flash_attn=\"auto\" for this target: {choice.summary() if choice is not None else 'llama.cpp chooses'}")


def curve(model: Path, threads: int, sizes: tuple[int, ...] = (1, 2, 5, 9, 17),
          contexts: tuple[int, ...] = (16, 128, 350, 1000)) -> None:
    """Print the fastest of 4 timings of a pass over each of ``sizes`` tokens after each of ``contexts``, per setting."""
    import time

    print(f"{model.name}, {threads} thread(s): ms of one pass over n tokens after a context (fastest of 4, no logits)")
    for setting in SETTINGS:
        engine = open_engine(EngineSettings(model=model, n_ctx=2048, n_threads=threads, flash_attn=setting))
        try:
            for context in contexts:
                best = {}
                for n in sizes:
                    for _ in range(4):
                        engine.reset(0)
                        engine.advance([5] * context)
                        began = time.perf_counter()
                        engine.advance([7] * n)
                        best[n] = min(best.get(n, float("inf")), time.perf_counter() - began)
                print(f"  {setting:<4} after {context:>4}: " + "  ".join(f"n={n} {s * 1e3:7.2f}" for n, s in best.items()))
        finally:
            engine.close()


def run(args: argparse.Namespace, engines: dict) -> dict[tuple[str, str, str], list[float]]:
    """Milliseconds of generation per (setting, decoding, prompt), one per repeat."""
    ms: dict[tuple[str, str, str], list[float]] = {}
    for rep in range(args.repeats):
        for pid, _, text in PROMPT_SETS[args.set]:
            for setting in SETTINGS if rep % 2 == 0 else SETTINGS[::-1]:  # (alternating: neither always first)
                target, draft = engines[setting]
                prompt = target.tokenize(text)
                for decoding in DECODINGS:
                    kind = "none" if decoding == "plain" else args.kind
                    decoder = make_decoder(target, DrafterSettings(kind=kind), draft if decoding == "adaptive" else None)
                    start_afresh([e for e in (target, draft) if e is not None])
                    stats = decoder.generate(prompt, args.n, ignore_eog=True).stats
                    ms.setdefault((setting, decoding, pid), []).append(1e3 * stats.generation_seconds)
    return ms


if __name__ == "__main__":
    main()
