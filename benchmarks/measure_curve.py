"""Measure a model's pass costs up to 65 tokens, as policy_sim.py's ``--curve`` takes them.

Usage: python benchmarks/measure_curve.py MODEL.gguf [-t THREADS] [--name NAME]

Prints ``NAME=T1_MS:R2,R3,R5,R9,R17,R33,R65:SWITCH``: the one-token pass in milliseconds, T(n)/T(1)
for n = 2 ... 65 and what a one-token pass after one of another size costs more, as a share of
T(1) (the fastest of three rounds each, as ``specdec calibrate`` measures its sizes up to 9 in
two). The simulation gives the schedule the sizes up to 9, as a real run's calibration, and
charges all of them on its clock, so it replays prompt lookup's long passes at their measured cost.
Time it with nothing else running.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.factory import open_engine  # noqa: E402
from specdec_gguf.profile import measure  # noqa: E402
from specdec_gguf.settings import EngineSettings  # noqa: E402

SIZES = (1, 2, 3, 5, 9, 17, 33, 65)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--name", default=None, help="the curve's name (default: the model file's stem)")
    args = parser.parse_args()
    engine = open_engine(EngineSettings(model=args.model, n_threads=args.threads))
    try:
        profile = measure(engine, sizes=SIZES, repeats=3, budget=60.0)
    finally:
        engine.close()
    ratios = profile.ratios()
    t1 = profile.seconds[1]
    print(f"{args.name or args.model.stem}={t1 * 1e3:.3f}:" + ",".join(f"{ratios[n]:.3f}" for n in SIZES[1:])
          + f":{profile.switch_seconds / t1:.3f}")


if __name__ == "__main__":
    main()
