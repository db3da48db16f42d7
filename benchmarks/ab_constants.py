"""The adaptive schedule's constants side by side: plain, the shipped constants and variants.

Usage:
  python benchmarks/ab_constants.py CASE [--kind prompt-lookup|draft-model] [--threads 2] [-n 64]
                                    [--repeats 20] [--k 4,6] [--variant NAME:field=value,...] ...

CASE: a tiny family of benchmarks/matrix.py (tiny-f32, tiny-wide, tiny-mid-q8, tiny-big-q8: written
to a temporary folder) or a target GGUF path (``--draft`` for its draft model). A variant replaces
fields of ``ScheduleConstants`` (``--variant old:guard_quiet_pause=8``); ``--k`` adds fixed-k arms.

Arms are interleaved (their order rotated each repeat), each trial with a fresh decoder that prefills
its prompt as `specdec run` starts, on the default prompt set, with one temporary user cache (cost profiles and
remembered calibrations) for the whole run. Prints, per arm, plain's median time over the arm's
per prompt and their geomean: the ratios the docs quote as "side by side". Run it on an otherwise
idle machine; the tiny models' ratios move 1-2% between processes, so repeat the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.benchmark import geomean, start_afresh  # noqa: E402
from specdec_gguf.decoder import SpeculativeDecoder  # noqa: E402
from specdec_gguf.factory import make_drafter, open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.schedule import ScheduleConstants  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402
from matrix import TINY, write_case  # noqa: E402


def parse_variant(spec: str) -> tuple[str, ScheduleConstants]:
    """``NAME:field=value,...`` -> (NAME, the shipped constants with those fields replaced)."""
    name, _, fields = spec.partition(":")
    shipped = ScheduleConstants()
    changes = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        if not hasattr(shipped, key):
            raise SystemExit(f"--variant {spec!r}: ScheduleConstants has no field {key!r}")
        changes[key] = type(getattr(shipped, key))(value)
    if not name or name in ("plain", "shipped") or name.startswith("k="):
        raise SystemExit(f"--variant {spec!r}: give it a name of its own")
    return name, dataclasses.replace(shipped, **changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", help="a tiny family of benchmarks/matrix.py, or a target GGUF path")
    parser.add_argument("--draft", type=Path, help="the draft model for a target path")
    parser.add_argument("--kind", choices=["prompt-lookup", "draft-model"], default="prompt-lookup")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--k", default="", help="fixed k arms (comma-separated)")
    parser.add_argument("--variant", action="append", default=[], help="NAME:field=value,... (repeatable)")
    args = parser.parse_args()
    variants = dict([("shipped", ScheduleConstants())] + [parse_variant(v) for v in args.variant])
    fixed = [int(k) for k in args.k.split(",") if k]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SPECDEC_CACHE_DIR"] = str(Path(tmp) / "cache")  # (read when a decoder is made)
        if args.case in TINY:
            family = write_case(args.case, Path(tmp) / args.case)
            target_path, draft_path = family.target, family.draft
        else:
            target_path, draft_path = Path(args.case), args.draft
        if args.kind == "draft-model" and draft_path is None:
            raise SystemExit("--kind draft-model needs a draft model (--draft)")
        target = open_engine(EngineSettings(model=target_path, n_ctx=2048, n_threads=args.threads))
        draft = open_engine(EngineSettings(model=draft_path, n_ctx=2048, n_threads=args.threads)) \
            if args.kind == "draft-model" else None

        def decoder(arm: str) -> SpeculativeDecoder:
            if arm == "plain":
                return SpeculativeDecoder(target)
            if arm.startswith("k="):
                settings = DrafterSettings(kind=args.kind, num_draft_tokens=int(arm[2:]), adaptive=False)
                return SpeculativeDecoder(target, make_drafter(settings, draft), num_draft_tokens=int(arm[2:]),
                                          adaptive=False)
            return SpeculativeDecoder(target, make_drafter(DrafterSettings(kind=args.kind), draft),
                                      constants=variants[arm])

        engines = [engine for engine in (target, draft) if engine is not None]
        prompts = [(pid, target.tokenize(text)) for pid, _, text in PROMPT_SETS["default"]]
        arms = ["plain", *(f"k={k}" for k in fixed), *variants]
        for arm in arms:  # warm up llama.cpp, measure the cost profiles once
            decoder(arm).generate(prompts[0][1], 16, ignore_eog=True)
        seconds: dict[tuple[str, str], list[float]] = defaultdict(list)
        for rep in range(args.repeats):
            for pid, tokens in prompts:
                for arm in arms[rep % len(arms):] + arms[:rep % len(arms)]:  # each arm first as often
                    start_afresh(engines)
                    stats = decoder(arm).generate(tokens, args.n, ignore_eog=True).stats
                    seconds[arm, pid].append(stats.generation_seconds)
        for engine in engines:
            engine.close()
    print(f"{args.case}, {args.kind}, {args.threads} thread(s), {args.n} tokens, {args.repeats} repeats: "
          "plain / arm (median seconds per prompt)")
    for arm in arms[1:]:
        ratios = [statistics.median(seconds["plain", pid]) / statistics.median(seconds[arm, pid]) for pid, _ in prompts]
        print(f"  {arm:<10} {geomean(ratios):.3f}  (worst {min(ratios):.3f}) "
              + " ".join(f"{pid}={r:.3f}" for (pid, _), r in zip(prompts, ratios)))


if __name__ == "__main__":
    main()
