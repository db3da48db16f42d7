"""Draft policies on a virtual clock: every cost curve x every trace, no timing noise.

Usage: python benchmarks/policy_sim.py [--traces FILE.jsonl] [-n 64,256] [--curve NAME[=...]] [--json]

A trace is a prompt plus the target's greedy output (synthetic ones are built here;
`--traces` adds recorded ones: JSONL lines {"id", "prompt": [ids], "output": [ids],
"n_vocab"}, and with `--drafter draft-model`, a recorded draft's "draft_agree" and
"draft_confidence" per position, which the simulated draft replays: benchmarks/record_traces.py
--draft). Each run uses a fresh decoder (cold, as `specdec run`), so what counts
is how fast the policy learns. Reports simulated throughput relative to plain decoding,
for adaptive and fixed k, and adaptive's ratio to the best fixed k; per variant, the worst
trace, the worst case (a curve and answer length: the geomean over its traces, as a row of
benchmarks/matrix.py is over its prompts) and the geomeans.

`--remembered` adds a second adaptive run per trace that starts from the calibration the
earlier runs on the same curve left (as `specdec run` does with the user cache: the other
traces' cold runs, blended in order as calibrations.remember blends them; never the trace's
own run), and reports that one as "adaptive" (the cold one beside it).

`--in-turn` instead runs the adaptive schedule on the traces in turn, twice, each run starting from
what every earlier run left, remembered ones included (as a user's cache evolves), and reports the
second turn: it shows what `--remembered` can't, a calibration taught by earlier remembered runs taken
on a trace unlike them (a 1-thread quote-article after code edits, docs/performance.md).

`--variant NAME:field=value,...` (repeatable) also runs the adaptive schedule with those
``ScheduleConstants`` fields replaced, and prints one summary line per variant beside the
shipped constants': the noise-free way to compare constants before timing them.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.schedule import ScheduleConstants  # noqa: E402
from specdec_gguf.simulation import (CURVES, DraftStyle, Trace, in_turn, remembered, simulate_run,  # noqa: E402
                                    synthetic_traces)
from ab_constants import parse_variant  # noqa: E402


def load_traces(path: Path) -> list[Trace]:
    out = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            d = json.loads(line)
            out.append(Trace(d["id"], d["prompt"], d["output"], int(d["n_vocab"]), d.get("draft_agree"),
                             d.get("draft_confidence")))
    return out


def parse_curve(text: str) -> str:
    """A curve's name; NAME=T1_MS:R2,R3,R5,R9[,R17,R33,R65][:SWITCH] first adds it to simulation.CURVES
    (the schedule is given its sizes up to 9, as a real run's calibration; the clock charges all)."""
    usage = "NAME=T1_MS:R2,R3,R5,R9[,R17,R33,R65][:SWITCH]"
    if "=" not in text:
        if text not in CURVES:
            raise SystemExit(f"--curve {text!r}: not one of {sorted(CURVES)} (or define it: {usage})")
        return text
    name, spec = text.split("=", 1)
    try:
        fields = spec.split(":")
        ratios = [float(r) for r in fields[1].split(",")]
        if len(ratios) not in (4, 7) or len(fields) > 3:
            raise ValueError
        CURVES[name] = (float(fields[0]) / 1e3, {1: 1.0, **dict(zip((2, 3, 5, 9, 17, 33, 65), ratios))},
                        float(fields[2]) if len(fields) == 3 else 0.0)
    except (ValueError, IndexError):
        raise SystemExit(f"--curve {text!r}: expected {usage}") from None
    return name


def simulate_matrix(traces: list[Trace], curves: list[str], ns: list[int], variants: dict[str, ScheduleConstants | None],
                    *, drafter: str, agreement: float = 0.8, draft_style: DraftStyle = "informative", draft_ratio: float = 0.1,
                    remember: bool = False, sequence: bool = False, draft_overhead: float = 0.0) -> list[dict]:
    """Every trace on every curve at every answer length: plain, fixed k and each variant of the adaptive
    schedule (``variants`` must hold "shipped"); with ``remember``, each variant's adaptive run starts
    from what its cold runs on the other traces left (see the module docs); with ``sequence``, from what
    every earlier run left, as a user's cache holds it: the traces run in turn twice, each run starting
    from all the runs before it, and the second turn's run is reported. One row per run setting."""
    ks = [1, 2, 4, 8, 16, 32, 64] if drafter == "prompt-lookup" else [1, 2, 4, 8]
    rows = []
    for n in ns:
        for curve in curves:
            runs: dict[str, dict[str, tuple]] = {name: {} for name in variants}  # (run, its cold adaptive run)
            for name, constants in variants.items():
                for trace in traces:
                    run = functools.partial(simulate_run, trace, curve, n, drafter=drafter, agreement=agreement,
                                            draft_style=draft_style, draft_ratio=draft_ratio,
                                            draft_overhead=draft_overhead, constants=constants)
                    runs[name][trace.id] = run, run(None)
            in_turn = {name: _in_turn(traces, {t: r for t, (r, _) in runs[name].items()}) for name in variants} \
                if sequence else {}
            for trace in traces:
                run, cold = runs["shipped"][trace.id]
                plain = run(0).seconds
                fixed = {k: run(k).seconds for k in ks}
                best_k = min(fixed, key=fixed.get)
                row = {"n": n, "curve": curve, "trace": trace.id, "cold": plain / cold.seconds,
                       "best_fixed": plain / fixed[best_k], "best_k": best_k, "variants": {}}
                for name in variants:
                    vrun, vcold = runs[name][trace.id]
                    adaptive = vcold.seconds
                    if sequence:
                        adaptive = in_turn[name][trace.id]
                    elif remember:
                        others = [runs[name][t.id][1] for t in traces if t.id != trace.id]
                        adaptive = vrun(None, calibrations=remembered(others)).seconds
                    row["variants"][name] = plain / adaptive
                row["adaptive"] = row["variants"]["shipped"]
                row["vs_best"] = row["adaptive"] / row["best_fixed"]
                rows.append(row)
    return rows


def _in_turn(traces: list[Trace], run_of: dict[str, functools.partial]) -> dict[str, float]:
    """Adaptive seconds per trace in the second of two turns over ``traces`` (simulation.in_turn)."""
    runs = in_turn(traces, lambda trace, stored: run_of[trace.id](None, stored=stored))
    return {trace_id: run.seconds for trace_id, run in runs.items()}


def summaries(rows: list[dict]) -> list[str]:
    """Per variant: its worst trace, its worst case (one curve and answer length: the geomean over its
    traces, as a row of benchmarks/matrix.py is over its prompts), and its geomeans over plain and over
    the best fixed k."""
    lines = []
    for name in rows[0]["variants"]:
        ratios = [r["variants"][name] for r in rows]
        worst = min(rows, key=lambda r: r["variants"][name])
        cases: dict[tuple[str, int], list[float]] = {}
        for r in rows:
            cases.setdefault((r["curve"], r["n"]), []).append(np.log(r["variants"][name]))
        case, logs = min(cases.items(), key=lambda item: np.mean(item[1]))
        lines.append(f"{name}: worst adaptive/plain {worst['variants'][name]:.3f} ({worst['curve']}, {worst['trace']}, "
                     f"n={worst['n']}); worst case {np.exp(np.mean(logs)):.3f} ({case[0]}, n={case[1]}); geomean "
                     f"adaptive/plain {np.exp(np.mean(np.log(ratios))):.3f}; geomean adaptive/best-fixed "
                     f"{np.exp(np.mean([np.log(r['variants'][name] / r['best_fixed']) for r in rows])):.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=Path, help="recorded traces (JSONL) to add to the synthetic ones")
    parser.add_argument("-n", default="64,256", help="answer lengths (comma-separated)")
    parser.add_argument("--drafter", choices=["prompt-lookup", "draft-model"], default="prompt-lookup")
    parser.add_argument("--draft-style", choices=["informative", "underconfident"], default="informative",
                        help="the simulated draft's confidences (see simulation.draft_pattern)")
    parser.add_argument("--agreement", type=float, default=0.8, help="the simulated draft's agreement in easy stretches")
    parser.add_argument("--draft-ratio", type=float, default=0.1,
                        help="a draft model's one-token pass over the target's (tiny-wide's pair: 0.13 at 2 threads)")
    parser.add_argument("--draft-overhead", type=float, default=0.0,
                        help="what each draft proposal costs beyond its passes, over the target's one-token pass "
                             "(the drafter's own work and caches the target evicted: 0.11 on tiny-wide at 1 thread)")
    parser.add_argument("--only-recorded", action="store_true")
    parser.add_argument("--remembered", action="store_true",
                        help="adaptive starts from the calibration the other traces' runs left (a second run)")
    parser.add_argument("--in-turn", action="store_true",
                        help="adaptive runs the traces in turn twice, each run starting from what all runs before "
                             "it left (a user's cache); the second turn is reported")
    parser.add_argument("--variant", action="append", default=[], help="NAME:field=value,... (repeatable)")
    parser.add_argument("--curve", action="append", default=[],
                        help="run only these curves (repeatable): a name of simulation.CURVES, or a measured one as "
                             "NAME=T1_MS:R2,R3,R5,R9[,R17,R33,R65][:SWITCH] (T(n)/T(1) for n = 2, 3, 5, 9, as "
                             "`specdec calibrate` prints them, and optionally 17, 33, 65, which only the clock "
                             "charges: benchmarks/measure_curve.py; SWITCH: a one-token pass after another size costs "
                             "this share of T(1) more)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    curves = [parse_curve(c) for c in args.curve] or list(CURVES)
    variants: dict[str, ScheduleConstants | None] = {"shipped": None}
    variants.update(parse_variant(v) for v in args.variant)
    traces = [] if args.only_recorded else synthetic_traces()
    if args.traces:
        traces += load_traces(args.traces)
    rows = simulate_matrix(traces, curves, [int(x) for x in args.n.split(",")], variants, drafter=args.drafter,
                           agreement=args.agreement, draft_style=args.draft_style, draft_ratio=args.draft_ratio,
                           remember=args.remembered, sequence=args.in_turn, draft_overhead=args.draft_overhead)
    if args.json:
        print(json.dumps(rows))
        return
    cold = f" {'cold':>6}" if args.remembered else ""
    print(f"{'n':>4} {'curve':<11} {'trace':<18} {'adaptive':>8}{cold} {'best k':>7} {'best fixed':>10} {'vs best':>8}")
    for r in rows:
        flag = " <" if r["adaptive"] < 0.97 else ""
        cold = f" {r['cold']:>5.2f}x" if args.remembered else ""
        print(f"{r['n']:>4} {r['curve']:<11} {r['trace']:<18} {r['adaptive']:>7.2f}x{cold} {r['best_k']:>7} "
              f"{r['best_fixed']:>9.2f}x {r['vs_best']:>7.2f}x{flag}")
    for line in summaries(rows):
        print(line)


if __name__ == "__main__":
    main()
