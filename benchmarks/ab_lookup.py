"""Adaptive prompt lookup as shipped against variants of its drafter's settings, side by side.

Usage:
  python benchmarks/ab_lookup.py MODEL.gguf --arm NAME:attribute=value[,...] [--arm ...] [-t 2] [-n 128]
                                 [--set default,short] [--only ID,...] [--repeats 3] [--remember] [--exact]
                                 [--temp 0.8]

  e.g. --arm stop:follow_loops=False          (proposals stop at the context's end)
       --arm long-only:short_matches_from=None (short matches are searched for only where they could be verified)

Arms, interleaved per prompt and repeat as `specdec bench` interleaves its strategies: plain decoding,
each ``--arm`` (adaptive prompt lookup with those ``PromptLookupDrafter`` attributes set, values as Python
literals), and the shipped drafter last. A fresh decoder per trial whose engine prefills the prompt (as
`specdec run` starts), in one temporary user cache: cost profiles are shared, remembered calibrations only
with ``--remember`` (else every run is a first run), each arm its own (shared, the shipped arm read what the
arm before it had just learned on the same prompt: ab_constants.own_stores). Prints per prompt each arm's median throughput over
plain's (≠: an answer that is not plain decoding's), shipped over the first arm, and the geomeans.
``--temp``: every arm samples at that temperature (fresh draws per trial; plain decoding's answer is then no
reference, so no ≠ marks). ``--exact`` loads the target in exact mode (a GGML_LLAMAFILE=OFF build:
docs/exactness.md). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.benchmark import Strategy, Trial, start_afresh, summarize  # noqa: E402
from specdec_gguf.drafters import PromptLookupDrafter  # noqa: E402
from specdec_gguf.factory import make_decoder, open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.sampling import SamplingParams  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402
from ab_constants import use_store  # noqa: E402

SHIPPED = "shipped"


def parse_arm(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:attribute=value,...`` -> (name, {attribute: value}); values are Python literals."""
    name, _, rest = text.partition(":")
    if not name or name in ("plain", SHIPPED):
        raise SystemExit(f"--arm {text!r}: give the arm a name other than plain or {SHIPPED}")
    settings: dict[str, Any] = {}
    probe = PromptLookupDrafter()
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if not hasattr(probe, key):
            raise SystemExit(f"--arm {text!r}: PromptLookupDrafter has no attribute {key!r}")
        try:
            settings[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(f"--arm {text!r}: {value!r} is not a Python literal") from None
    return name, settings


def built_in_prompts(target: Any, sets: str, only: str | None) -> list[tuple[str, str, list[int]]]:
    """(id, text, tokens) of the built-in prompts of ``sets`` (comma-separated), only those of ``only`` if given."""
    prompts = [(pid, text, target.tokenize(text)) for name in sets.split(",") for pid, _, text in PROMPT_SETS[name]
               if only is None or pid in only.split(",")]
    if not prompts:
        raise SystemExit(f"no prompt of {sets} is in --only {only}")
    return prompts


def add_run_arguments(parser: argparse.ArgumentParser, *, n: int, sets: str) -> None:
    """The arguments every side-by-side script here takes: the model, threads, answer length, prompts, repeats
    and exact mode."""
    parser.add_argument("model", type=Path)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-n", type=int, default=n)
    parser.add_argument("--set", default=sets, help="built-in prompt sets, comma-separated")
    parser.add_argument("--only", help="prompt ids to run (comma-separated; default: every prompt of the sets)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exact", action="store_true", help="the target in exact mode (docs/exactness.md)")


def run(model: Path, arms: dict[str, dict[str, Any]], *, threads: int, n: int, sets: str, repeats: int,
        remember: bool, exact: bool, only: str | None = None, temperature: float = 0.0) -> None:
    """Time plain decoding, each arm and the shipped drafter on the prompts of ``sets``, and print the ratios."""
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="specdec-ab-lookup-")
    stores = Path(os.environ["XDG_CACHE_HOME"]) / "stores"
    target = open_engine(EngineSettings(model=model, n_ctx=2048, n_threads=threads, exact=exact))
    prompts = [(pid, tokens) for pid, _, tokens in built_in_prompts(target, sets, only)]
    make_decoder(target, DrafterSettings(kind="none")).generate(prompts[0][1], 32, ignore_eog=True)  # warm up
    settings: dict[str, dict[str, Any] | None] = {"plain": None, **arms, SHIPPED: {}}
    strategies = [Strategy(arm, DrafterSettings(kind="none" if s is None else "prompt-lookup"))
                  for arm, s in settings.items()]
    sampling = SamplingParams(temperature=temperature)
    trials = []
    for rep in range(repeats):
        for pid, tokens in prompts:
            for strategy, arm in zip(strategies, settings.values()):
                use_store(stores, strategy.name)  # (each arm its own: see ab_constants.own_stores)
                decoder = make_decoder(target, strategy.drafter, remember=remember)
                for key, value in (arm or {}).items():
                    setattr(decoder.drafter, key, value)
                start_afresh([target])
                result = decoder.generate(tokens, n, sampling, ignore_eog=True)
                trials.append(Trial(strategy.name, pid, rep, result.stats.generation_throughput, 0.0, 0.0, 0.0,
                                    tuple(result.tokens)))
    reports = [r for r in summarize(trials, strategies, greedy=sampling.greedy) if r.name != "plain"]
    first, shipped = reports[0], reports[-1]
    for pid, _ in prompts:
        plain = statistics.median(t.throughput for t in trials if t.strategy == "plain" and t.prompt_id == pid)
        print(f"{pid:<16} plain {plain:6.1f} tok/s  "
              + "  ".join(f"{r.name} {r.per_prompt_speedup[pid]:.3f}x{'' if r.same_output.get(pid, True) else ' ≠'}"
                          for r in reports)
              + f"  {SHIPPED}/{first.name} {shipped.per_prompt_speedup[pid] / first.per_prompt_speedup[pid]:.3f}",
              flush=True)
    print(f"t={threads} n={n} {sets} remember={remember} exact={exact} temp={temperature}: geomean "
          + ", ".join(f"{r.name} {r.speedup:.3f}x" for r in reports)
          + f", {SHIPPED}/{first.name} {shipped.speedup / first.speedup:.3f}; worst "
          + ", ".join(f"{r.name} {min(r.per_prompt_speedup.values()):.3f}x" for r in reports))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser, n=128, sets="default,short")
    parser.add_argument("--arm", action="append", default=[], required=True,
                        help="NAME:attribute=value,... (repeatable; the shipped drafter is compared with the first)")
    parser.add_argument("--remember", action="store_true", help="runs read and write remembered calibrations")
    parser.add_argument("--temp", type=float, default=0.0, help="sample at this temperature (0: greedy)")
    args = parser.parse_args()
    arms = dict(parse_arm(text) for text in args.arm)
    run(args.model, arms, threads=args.threads, n=args.n, sets=args.set, repeats=args.repeats,
        remember=args.remember, exact=args.exact, only=args.only, temperature=args.temp)


if __name__ == "__main__":
    main()
