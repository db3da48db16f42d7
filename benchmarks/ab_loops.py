"""Adaptive prompt lookup with and without following loops (``PromptLookupDrafter(follow_loops=)``), side by side.

Usage:
  python benchmarks/ab_loops.py MODEL.gguf [-t 2] [-n 128] [--set default,short] [--only ID,...] [--repeats 3] [--remember] [--exact]

``benchmarks/ab_lookup.py`` with one arm, ``stop`` (proposals stop at the context's end: ``follow_loops=False``),
against the shipped drafter, which copies a context that repeats itself on past its end. See ab_lookup.py for
how the arms are run and what is printed.
"""

from __future__ import annotations

import argparse

from ab_lookup import add_run_arguments, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser, n=128, sets="default,short")
    parser.add_argument("--remember", action="store_true", help="runs read and write remembered calibrations")
    args = parser.parse_args()
    run(args.model, {"stop": {"follow_loops": False}}, threads=args.threads, n=args.n, sets=args.set,
        repeats=args.repeats, remember=args.remember, exact=args.exact, only=args.only)


if __name__ == "__main__":
    main()
