"""Every simulation a schedule change is judged by, one summary line each: the check before timing.

Usage: python benchmarks/policy_suite.py [--variant NAME:field=value,...] [--recorded FILE:RATIO|lookup[:CURVE]]
                                        [-n 64,256]

Runs benchmarks/policy_sim.py's matrix for prompt lookup and for the synthetic draft models
(informative and underconfident), each cold and remembered, and for every ``--recorded`` file of
real-draft traces (benchmarks/record_traces.py --draft) remembered, at that draft's cost ratio, on
every curve or on the measured curve given (policy_sim.py --curve's NAME=T1_MS:R2,R3,R5,R9[...][:SWITCH]);
``FILE:lookup[:CURVE]`` runs a file of recorded outputs (record_traces.py without --draft) with prompt
lookup instead. ``--in-turn`` adds each simulation with its traces run in turn, each run starting from
what all earlier ones left (policy_sim.py --in-turn).
Per simulation and variant: the worst trace, the worst case (a curve and answer length, the geomean
over its traces, as a matrix row is over its prompts) and the geomeans over plain and over the best
fixed k. A change worth timing keeps every worst case and moves no geomean the wrong way.

Example (the tiny-wide pair's recording on its own 2-thread curve, and on all curves):
  python benchmarks/policy_suite.py --variant off:guess_typical=false \\
      --recorded tiny-wide.jsonl:0.132:tiny-wide-2t=3.594:1.248,1.455,1.813,2.265:0.001 --recorded tiny-wide.jsonl:0.13
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.schedule import ScheduleConstants  # noqa: E402
from specdec_gguf.simulation import CURVES, synthetic_traces  # noqa: E402
from ab_constants import parse_variant  # noqa: E402
from policy_sim import load_traces, parse_curve, simulate_matrix, summaries  # noqa: E402


STANDARD_CURVES = list(CURVES)  # (before --recorded adds measured ones)


def parse_recorded(text: str) -> tuple[Path, float | None, list[str]]:
    """FILE:RATIO|lookup[:CURVE] -> (the traces file, the draft's cost ratio (None: prompt lookup), the curves
    to run)."""
    parts = text.split(":", 2)
    try:
        ratio = None if parts[1] == "lookup" else float(parts[1])
    except (IndexError, ValueError):
        raise SystemExit(f"--recorded {text!r}: expected FILE:RATIO[:CURVE] or FILE:lookup[:CURVE]") from None
    if ratio is not None and not 0.0 < ratio:
        raise SystemExit(f"--recorded {text!r}: the draft ratio must be > 0")
    return Path(parts[0]), ratio, [parse_curve(parts[2])] if len(parts) == 3 else STANDARD_CURVES


def main(argv: list[str] | None = None) -> list[tuple[str, list[dict]]]:
    """Run the suite (``argv``: the command line's arguments); returns each simulation's label and rows."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", default=[], help="NAME:field=value,... (repeatable)")
    parser.add_argument("--recorded", action="append", default=[],
                        help="FILE:RATIO[:CURVE] or FILE:lookup[:CURVE] (repeatable)")
    parser.add_argument("-n", default="64,256", help="answer lengths (comma-separated)")
    parser.add_argument("--in-turn", action="store_true",
                        help="also each simulation with the traces run in turn (policy_sim.py --in-turn)")
    args = parser.parse_args(argv)
    variants: dict[str, ScheduleConstants | None] = {"shipped": None}
    variants.update(parse_variant(v) for v in args.variant)
    recorded = [parse_recorded(r) for r in args.recorded]  # (parsed first: a bad one fails before any run)
    ns = [int(x) for x in args.n.split(",")]
    synthetic = synthetic_traces()
    results: list[tuple[str, list[dict]]] = []

    def report(label: str, rows: list[dict]) -> None:
        results.append((label, rows))
        show(label, rows)

    suite = [("lookup", dict(drafter="prompt-lookup"))] + [
        (f"draft {style}", dict(drafter="draft-model", draft_style=style)) for style in ("informative", "underconfident")]
    for label, settings in suite:
        for remember in (False, True):
            rows = simulate_matrix(synthetic, STANDARD_CURVES, ns, variants, remember=remember, **settings)  # type: ignore[arg-type]
            report(f"{label}{', remembered' if remember else ''}", rows)
        if args.in_turn:
            rows = simulate_matrix(synthetic, STANDARD_CURVES, ns, variants, sequence=True, **settings)  # type: ignore[arg-type]
            report(f"{label}, in turn", rows)
    for path, ratio, curves in recorded:
        where = curves[0] if len(curves) == 1 else "every curve"
        settings = dict(drafter="prompt-lookup") if ratio is None else dict(drafter="draft-model", draft_ratio=ratio)
        what = f"{path.name}, prompt lookup ({where})" if ratio is None else f"{path.name} at {ratio} ({where})"
        for mode in ("remembered", "in turn") if args.in_turn else ("remembered",):
            rows = simulate_matrix(load_traces(path), curves, ns, variants, remember=True,
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
