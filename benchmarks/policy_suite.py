"""Every simulation a schedule change is judged by, one summary line each: the check before timing.

Usage: python benchmarks/policy_suite.py [--variant NAME:field=value,...]
                                        [--recorded FILE:RATIO[+OVERHEAD]|lookup[:CURVE]] [-n 64,256]
                                        [--in-turn] [--jitter 0.95,1.05]

Runs benchmarks/policy_sim.py's matrix for prompt lookup and for the synthetic draft models
(informative and underconfident), each cold and remembered, and for every ``--recorded`` file of
real-draft traces (benchmarks/record_traces.py --draft) remembered, at that draft's cost ratio (per drafted
token, over a target step; ``+OVERHEAD``: what each proposal costs besides, policy_sim.py --draft-overhead), on
every curve or on the measured curve given (policy_sim.py --curve's NAME=T1_MS:R2,R3,R5,R9[...][:SWITCH]);
``FILE:lookup[:CURVE]`` runs a file of recorded outputs (record_traces.py without --draft) with prompt
lookup instead. ``--in-turn`` adds each simulation with its traces run in turn, each run starting from
what all earlier ones left (policy_sim.py --in-turn). ``--jitter 0.95,1.05`` reports each run's ratio as its
geomean over the curve as measured and the curve with its extra cost per token (and a draft model's price) times
each factor: a worst trace on a knife's edge then moves by what a change does (jittered_matrix).
Per simulation and variant: the worst trace, the worst case (a curve and answer length, the geomean
over its traces, as a matrix row is over its prompts) and the geomeans over plain and over the best
fixed k. A change worth timing keeps every worst case and moves no geomean the wrong way.

Example (the tiny-wide pair's recording on its own 2-thread curve, and on all curves):
  python benchmarks/policy_suite.py --variant off:guess_typical=false \\
      --recorded tiny-wide.jsonl:0.132:tiny-wide-2t=3.594:1.248,1.455,1.813,2.265:0.001 --recorded tiny-wide.jsonl:0.13
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.benchmark import geomean  # noqa: E402
from specdec_gguf.schedule import ScheduleConstants  # noqa: E402
from specdec_gguf.simulation import CURVES, Trace, synthetic_traces  # noqa: E402
from ab_constants import parse_variant  # noqa: E402
from policy_sim import load_traces, parse_curve, simulate_matrix, summaries  # noqa: E402


STANDARD_CURVES = list(CURVES)  # (before --recorded adds measured ones)


def perturbed(curve: str, factor: float) -> str:
    """The name of ``curve`` with each pass's cost beyond a one-token pass times ``factor`` (added to CURVES)."""
    base, ratios, switch = CURVES[curve]
    name = f"{curve}~{factor:g}"
    CURVES[name] = (base, {n: 1.0 + (r - 1.0) * factor for n, r in ratios.items()}, switch)
    return name


def jittered_matrix(traces: list[Trace], curves: list[str], ns: list[int],
                    variants: dict[str, ScheduleConstants | None], factors: Sequence[float], **settings) -> list[dict]:
    """policy_sim.simulate_matrix's rows, each variant's ratio the geomean over the curves as measured and the
    curves (and a draft model's price) with their extra cost per token times each of ``factors``. A worst trace
    can sit on a knife's edge (three unlucky first rounds start the guard's doubling pauses, or not): a change
    that moves it there and back moves its single value by up to 10% (docs/performance.md, "forty-first"), while
    over a few neighbouring costs it moves by what the change does. Fixed k's rows stay as measured."""
    rows = simulate_matrix(traces, curves, ns, variants, **settings)
    if not factors:
        return rows
    others = []
    for factor in factors:
        moved = dict(settings)
        if moved.get("drafter") == "draft-model":
            moved["draft_ratio"] = moved.get("draft_ratio", 0.1) * factor
            moved["draft_overhead"] = moved.get("draft_overhead", 0.0) * factor
        others.append(simulate_matrix(traces, [perturbed(c, factor) for c in curves], ns, variants, **moved))
    for i, row in enumerate(rows):
        for name in row["variants"]:
            values = [row["variants"][name]] + [other[i]["variants"][name] for other in others]
            row["variants"][name] = geomean(values)
        row["adaptive"] = row["variants"]["shipped"]
        row["vs_best"] = row["adaptive"] / row["best_fixed"]
    return rows


def parse_recorded(text: str) -> tuple[Path, dict[str, object], list[str]]:
    """FILE:RATIO[+OVERHEAD]|lookup[:CURVE] -> (the traces file, its drafter's simulate_matrix settings: prompt
    lookup, or a draft model costing RATIO of a target step per drafted token and OVERHEAD of one per proposal,
    the curves to run)."""
    usage = "expected FILE:RATIO[+OVERHEAD][:CURVE] or FILE:lookup[:CURVE]"
    parts = text.split(":", 2)
    if len(parts) < 2:
        raise SystemExit(f"--recorded {text!r}: {usage}")
    curves = [parse_curve(parts[2])] if len(parts) == 3 else STANDARD_CURVES
    if parts[1] == "lookup":
        return Path(parts[0]), dict(drafter="prompt-lookup"), curves
    fields = parts[1].split("+")
    try:
        if len(fields) > 2:
            raise ValueError
        ratio, overhead = float(fields[0]), float(fields[1]) if len(fields) == 2 else 0.0
    except ValueError:
        raise SystemExit(f"--recorded {text!r}: {usage}") from None
    if not (0.0 < ratio < math.inf and 0.0 <= overhead < math.inf):
        raise SystemExit(f"--recorded {text!r}: the draft ratio must be > 0 and the overhead >= 0")
    return Path(parts[0]), dict(drafter="draft-model", draft_ratio=ratio, draft_overhead=overhead), curves


def main(argv: list[str] | None = None) -> list[tuple[str, list[dict]]]:
    """Run the suite (``argv``: the command line's arguments); returns each simulation's label and rows."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", default=[], help="NAME:field=value,... (repeatable)")
    parser.add_argument("--recorded", action="append", default=[],
                        help="FILE:RATIO[+OVERHEAD][:CURVE] or FILE:lookup[:CURVE] (repeatable)")
    parser.add_argument("-n", default="64,256", help="answer lengths (comma-separated)")
    parser.add_argument("--in-turn", action="store_true",
                        help="also each simulation with the traces run in turn (policy_sim.py --in-turn)")
    parser.add_argument("--jitter", default="",
                        help="factors (comma-separated) on each curve's extra cost per token and the draft's price: "
                             "each run's ratio is its geomean over them and the curve as measured")
    args = parser.parse_args(argv)
    variants: dict[str, ScheduleConstants | None] = {"shipped": None}
    variants.update(parse_variant(v) for v in args.variant)
    recorded = [parse_recorded(r) for r in args.recorded]  # (parsed first: a bad one fails before any run)
    ns = [int(x) for x in args.n.split(",")]
    synthetic = synthetic_traces()
    results: list[tuple[str, list[dict]]] = []
    factors = [float(f) for f in args.jitter.split(",") if f]
    if any(not f > 0.0 for f in factors):
        raise SystemExit(f"--jitter {args.jitter!r}: factors must be > 0")

    def report(label: str, rows: list[dict]) -> None:
        results.append((label, rows))
        show(label, rows)

    suite = [("lookup", dict(drafter="prompt-lookup"))] + [
        (f"draft {style}", dict(drafter="draft-model", draft_style=style)) for style in ("informative", "underconfident")]
    for label, settings in suite:
        for remember in (False, True):
            rows = jittered_matrix(synthetic, STANDARD_CURVES, ns, variants, factors, remember=remember,
                                   **settings)  # type: ignore[arg-type]
            report(f"{label}{', remembered' if remember else ''}", rows)
        if args.in_turn:
            rows = jittered_matrix(synthetic, STANDARD_CURVES, ns, variants, factors, sequence=True,
                                   **settings)  # type: ignore[arg-type]
            report(f"{label}, in turn", rows)
    for path, settings, curves in recorded:
        where = curves[0] if len(curves) == 1 else "every curve"
        what = f"{path.name}, prompt lookup ({where})"
        if settings["drafter"] == "draft-model":
            overhead = f" + {settings['draft_overhead']:g} a proposal" if settings["draft_overhead"] else ""
            what = f"{path.name} at {settings['draft_ratio']}{overhead} ({where})"
        for mode in ("remembered", "in turn") if args.in_turn else ("remembered",):
            rows = jittered_matrix(load_traces(path), curves, ns, variants, factors, remember=True,
                                   sequence=mode == "in turn", **settings)  # type: ignore[arg-type]
            report(f"{what}, {mode}", rows)
    return results


def show(label: str, rows: list[dict]) -> None:
    """Print one simulation's summary lines (policy_sim.summaries), a variant each."""
    print(label)
    for line in summaries(rows):
        print("  " + line)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
