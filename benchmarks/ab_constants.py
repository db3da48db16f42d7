"""The adaptive schedule's constants side by side: plain, the shipped constants and variants.

Usage:
  python benchmarks/ab_constants.py CASE [--kind prompt-lookup|draft-model] [--threads 2] [-n 64]
                                    [--repeats 20] [--k 4,6] [--adaptive-k 16] [--set default] [--variant NAME:field=value,...] [--detail]
                                    [--cache-from DIR] [--shared-store] [--temp 0.8 --seed 0]

CASE: a tiny family of benchmarks/matrix.py (tiny-f32, tiny-wide, tiny-mid-q8, tiny-big-q8: written
to a temporary folder) or a target GGUF path (``--draft`` for its draft model). A variant replaces
fields of ``ScheduleConstants`` (``--variant old:guard_quiet_pause=8``; with no fields, ``--variant same``, a
null arm: the shipped constants under another name, whose distance from ``shipped`` is the noise); ``--k`` adds
fixed-k arms;
``--adaptive-k`` adds the shipped adaptive schedule with other bounds on a proposal's length (a draft
model's is 8); ``--detail`` adds where each arm's time goes (target passes per answer and how many declined their
proposal, the shares of time spent drafting and outside llama.cpp, and the passes per answer by how many drafted
tokens each verified); ``--temp`` samples (repeat r with seed ``--seed`` + r: the arms of a repeat draw alike
where they draw alike, and each repeat draws other answers) instead of decoding greedily.

Arms are interleaved as `specdec bench` interleaves its strategies (``benchmark.run_trials``: a fresh
decoder per trial that prefills its prompt, as `specdec run` starts), on a built-in prompt set (`--set`), with
one temporary user cache for the whole run, empty or a copy of ``--cache-from`` (a user cache folder: what
its profiles and calibrations do to a run): the arms share its cost profiles, and each adaptive arm keeps
remembered calibrations of its own, as a user's runs of one version do (``own_stores``). Prints, per
arm, its median throughput over plain's per prompt and their geomean: the ratios the docs quote as
"side by side"; then the paired ratios (per prompt the median of each trial over the plain trial of the
same repeat, seconds apart: a host whose speed drifts moves both alike, so they scatter less). Run it on an
otherwise idle machine; the tiny models' ratios move 1-2% between processes, so repeat the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specdec_gguf.benchmark as benchmark_module  # noqa: E402
import specdec_gguf.calibrations as calibrations_module  # noqa: E402
from specdec_gguf.benchmark import Strategy, run_trials, summarize  # noqa: E402
from specdec_gguf.decoder import SpeculativeDecoder  # noqa: E402
from specdec_gguf.engine import TextModel  # noqa: E402
from specdec_gguf.factory import open_engine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.sampling import SamplingParams  # noqa: E402
from specdec_gguf.schedule import ScheduleConstants  # noqa: E402
from specdec_gguf.settings import DrafterSettings, EngineSettings  # noqa: E402
from matrix import TINY, strategies as matrix_strategies, write_case  # noqa: E402


def parse_variant(spec: str) -> tuple[str, ScheduleConstants]:
    """``NAME:field=value,...`` -> (NAME, the shipped constants with those fields replaced)."""
    name, _, fields = spec.partition(":")
    shipped = ScheduleConstants()
    changes = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        if not hasattr(shipped, key):
            raise SystemExit(f"--variant {spec!r}: ScheduleConstants has no field {key!r}")
        kind = type(getattr(shipped, key))
        if kind is bool:  # (bool("false") is True)
            if value.lower() not in ("true", "false", "1", "0"):
                raise SystemExit(f"--variant {spec!r}: {key} takes true or false, not {value!r}")
            changes[key] = value.lower() in ("true", "1")
            continue
        try:
            changes[key] = kind(value)
        except ValueError:
            raise SystemExit(f"--variant {spec!r}: {key} takes a value of type {kind.__name__}, not {value!r}") from None
    if not name or name in ("plain", "shipped") or " k=" in name or " adaptive" in name:
        raise SystemExit(f"--variant {spec!r}: give it a name of its own")
    return name, dataclasses.replace(shipped, **changes)


def sampling_for(temperature: float, seed: int) -> SamplingParams:
    """``--temp`` and ``--seed`` as the trials sample (temperature 0: greedy). run_trials samples repeat r with
    seed + r: the arms of a repeat draw from the same generator state, so where two arms' rounds line up they
    draw alike, and each repeat draws other answers, so the medians average the draws' luck too (with one
    seed for every trial a fixed k's repeats were one answer timed over and over: 8 repeats of the 16-layer
    pair at T = 0.8 put k = 8 at 1.49x plain and k = 4 at 1.26x on one draw each)."""
    return SamplingParams(temperature=temperature, seed=seed if temperature > 0 else None)


def use_store(root: Path, arm: str) -> None:
    """Point this process's calibration store at ``root/arm``: the decoders made after it read and write
    their remembered calibrations there (see own_stores)."""
    calibrations_module.store_dir = lambda: root / arm


def own_stores(strategies: list[Strategy], root: Path, start_from: Path | None) -> None:
    """Give each strategy's decoders a calibration store of their own under ``root`` (a copy of
    ``start_from`` where given), for this process. Shared, each arm's run read what the arm before it
    had just learned on the same prompt: two identical arms on Gemma Q8_0 at one thread (default set,
    64 tokens, 8 repeats) ran 1.215x and 1.317x plain, config-edit 0.859x and 1.203x; with a store
    each, 1.304x and 1.294x."""
    arms = {id(s.drafter): s.name for s in strategies}
    make = benchmark_module.make_decoder

    def make_decoder(target: TextModel, drafter: DrafterSettings, *args: Any, **kwargs: Any) -> SpeculativeDecoder:
        use_store(root, arms.get(id(drafter), "none"))  # (a trial generates right after its decoder is made)
        return make(target, drafter, *args, **kwargs)

    if start_from is not None and start_from.is_dir():
        for name in arms.values():
            shutil.copytree(start_from, root / name)
    benchmark_module.make_decoder = make_decoder


def print_ratios(arm: str, geomean: float, ratios: dict[str, float],
                 spread: tuple[float, float] | None = None) -> None:
    """One arm's line: its geomean over plain, its worst prompt, every prompt's ratio, and (paired) the
    lowest and highest one repeat's geomean reached."""
    by_repeat = f", repeats {spread[0]:.3f}-{spread[1]:.3f}" if spread else ""
    print(f"  {arm:<12} {geomean:.3f}  (worst {min(ratios.values()):.3f}{by_repeat}) "
          + " ".join(f"{pid}={r:.3f}" for pid, r in ratios.items()))


def arms(kind: str, fixed: list[int], variants: dict[str, ScheduleConstants], bounds: list[int],
         plain_twice: bool = False) -> list[Strategy]:
    """The strategies a run interleaves: plain, the fixed k (named as the matrix names them), ``plain again``
    with ``plain_twice`` (a second plain arm: its ratio to the first is the host's noise), each variant of the
    adaptive schedule, and the shipped one bounded at each of ``bounds``."""
    strategies = matrix_strategies(kind, fixed)[:-1]  # (the first plain arm is the one every ratio is over)
    if plain_twice:
        strategies.append(Strategy("plain again", DrafterSettings(kind="none")))
    strategies += [Strategy(name, DrafterSettings(kind=kind), constants=constants)  # type: ignore[arg-type]
                   for name, constants in variants.items()]
    strategies += [Strategy(f"bound {k}", DrafterSettings(kind=kind, num_draft_tokens=k))  # type: ignore[arg-type]
                   for k in bounds]
    return strategies


def case_arguments(parser: argparse.ArgumentParser, kind: str) -> None:
    """The arguments naming what a run times (shared with fresh_starts.py): the case, its draft, the drafter
    (``kind`` by default), threads and answer length."""
    parser.add_argument("case", help="a tiny family of benchmarks/matrix.py, or a target GGUF path")
    parser.add_argument("--draft", type=Path, help="the draft model for a target path")
    parser.add_argument("--kind", choices=["prompt-lookup", "draft-model"], default=kind)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("-n", type=int, default=64)


def case_models(args: argparse.Namespace, folder: Path) -> tuple[Path, Path | None]:
    """The target and draft GGUF files of ``args.case`` (a tiny family is written into ``folder``)."""
    if args.case in TINY:
        family = write_case(args.case, folder / args.case)
        target, draft = family.target, family.draft
    else:
        target, draft = Path(args.case), args.draft
    if args.kind == "draft-model" and draft is None:
        raise SystemExit("--kind draft-model needs a draft model (--draft)")
    return target, draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    case_arguments(parser, "prompt-lookup")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--k", default="", help="fixed k arms (comma-separated)")
    parser.add_argument("--adaptive-k", default="",
                        help="also the shipped adaptive schedule with these bounds on a proposal (comma-separated)")
    parser.add_argument("--set", default="default", choices=list(PROMPT_SETS), help="built-in prompts")
    parser.add_argument("--variant", action="append", default=[], help="NAME:field=value,... (repeatable)")
    parser.add_argument("--cache-from", type=Path,
                        help="start from a copy of this user cache folder (its profiles/ and calibrations/)")
    parser.add_argument("--shared-store", action="store_true",
                        help="one calibration store for every arm (as before 2026-12-05's twenty-first session)")
    parser.add_argument("--temp", type=float, default=0.0,
                        help="sampling temperature (0: greedy); repeat r samples with seed --seed + r")
    parser.add_argument("--seed", type=int, default=0, help="with --temp: the sampling seed of the first repeat")
    parser.add_argument("--plain-twice", action="store_true",
                        help="also a second plain arm ('plain again'): how far plain decoding scatters from "
                             "itself on this host, the floor under every other arm's ratio")
    parser.add_argument("--detail", action="store_true",
                        help="also print, per arm, where an answer's time goes (passes, declined ones, drafting, "
                             "outside llama.cpp) and its passes by how many drafted tokens each verified")
    args = parser.parse_args()
    variants = dict([("shipped", ScheduleConstants())] + [parse_variant(v) for v in args.variant])
    strategies = arms(args.kind, [int(k) for k in args.k.split(",") if k], variants,
                      [int(k) for k in args.adaptive_k.split(",") if k], args.plain_twice)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SPECDEC_CACHE_DIR"] = str(Path(tmp) / "cache")  # (read when a decoder is made)
        if args.cache_from is not None:
            shutil.copytree(args.cache_from, Path(tmp) / "cache")
        if not args.shared_store:
            own_stores(strategies, Path(tmp) / "stores", Path(tmp) / "cache" / "calibrations")
        target_path, draft_path = case_models(args, Path(tmp))
        target = open_engine(EngineSettings(model=target_path, n_ctx=2048, n_threads=args.threads))
        draft = open_engine(EngineSettings(model=draft_path, n_ctx=2048, n_threads=args.threads)) \
            if args.kind == "draft-model" else None
        try:
            prompts = [(pid, target.tokenize(text)) for pid, _, text in PROMPT_SETS[args.set]]
            trials = run_trials(target, draft, strategies, prompts, args.n, args.repeats,
                                sampling_for(args.temp, args.seed))
        finally:
            for engine in (draft, target):
                if engine is not None:
                    engine.close()
    decoding = f"temperature {args.temp}, seed {args.seed}" if args.temp > 0 else "greedy"
    print(f"{args.case}, {args.kind}, {decoding}, '{args.set}' prompts, {args.threads} thread(s), {args.n} tokens, {args.repeats} repeats: "
          "arm / plain (median throughput per prompt)")
    reports = summarize(trials, strategies)
    for report in reports[1:]:
        print_ratios(report.name, report.speedup, report.per_prompt_speedup)
    print("arm / plain, paired (per prompt the median over repeats of each trial over the same repeat's plain one)")
    for report in reports[1:]:
        print_ratios(report.name, report.paired_speedup or 0.0, report.per_prompt_paired, report.paired_spread)
    print("arm / plain, in their own plain steps (per prompt the median over repeats of the plain trial's time in "
          "its plain steps over each trial's: drift of the host's speed between trials cancels; slower target "
          "steps of the arm's own do not show)")
    for report in reports[1:]:
        if report.paired_in_steps is not None:
            print_ratios(report.name, report.paired_in_steps, report.per_prompt_in_steps)
    if args.detail:
        # Where an answer's time goes, over all prompts: its length at the median throughput, target
        # passes per answer (rounds, the mean of the counts) and how many of them declined their proposal
        # (plain steps that paid for a draft: looks), acceptance, the share of time spent drafting, and the share
        # spent outside llama_decode (Python, ctypes, and what either makes the next pass wait for).
        print("  arm          ms/answer  passes/answer  declined  acceptance  drafting  outside llama.cpp")
        for report in reports:
            share = f"{report.python_share:.1%}" if report.python_share is not None else "-"
            print(f"  {report.name:<12} {1e3 * args.n / report.median_throughput:9.2f}  "
                  f"{sum(report.passes_by_verified):13.1f}  {report.declined:8.1f}  "
                  f"{report.acceptance_rate:10.2f}  {report.draft_share:8.1%}  {share:>17}")
        # How long the passes were: a schedule's mix of lengths against a fixed k's one.
        print("  passes per answer by drafted tokens verified (0: plain steps)")
        for report in reports[1:]:
            sizes = ", ".join(f"{j}: {n:.1f}" for j, n in enumerate(report.passes_by_verified) if n >= 0.05)
            print(f"  {report.name:<12} {sizes}")


if __name__ == "__main__":
    main()
