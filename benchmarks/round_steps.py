"""Where a consulted round's time goes on a model whose rounds take 100-250 us (the tiny F32 pair).

Usage:
  python benchmarks/round_steps.py [--threads 2] [-n 64] [--repeats 30]

Times each call the decoder makes in a round (the target's pass, the schedule's and the
drafter's calls) by wrapping them, for adaptive prompt lookup and for plain decoding on the
open-ended prompts of the default set, fresh decoders, arms interleaved; prints the median
and mean microseconds per call. In a tight loop the schedule's and the drafter's calls cost
a few microseconds together; here they run right after a pass, with the caches cold, and the
pass after them runs with the model's data partly evicted (the tiny F32 model is 1 MB: it
lives in L2 between passes). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.decoder import SpeculativeDecoder  # noqa: E402
from specdec_gguf.drafters import PromptLookupDrafter  # noqa: E402
from round_overhead import arguments, tiny_target  # noqa: E402  (the same model, prompts and flags)

STEPS = {"schedule": ("plain_rounds", "next_k", "budget", "choose", "observe"), "drafter": ("propose", "accept")}


class _Round:
    """Whether the round under way consulted the drafter (its calls are told apart from a pause's)."""

    consulted = False


def _timed(name: str, call: Callable[..., Any], calls: dict[str, list[float]], state: type[_Round]) -> Callable[..., Any]:
    clock = time.perf_counter_ns

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name == "drafter.propose":
            state.consulted = True
        t0 = clock()
        out = call(*args, **kwargs)
        elapsed = (clock() - t0) / 1000
        if name in ("target pass", "drafter.accept", "schedule.observe"):
            calls[f"{name} ({'consulted' if state.consulted else 'paused or told'})"].append(elapsed)
            if name == "schedule.observe":
                state.consulted = False  # (a round's last call)
        else:
            calls[name].append(elapsed)
        return out

    return wrapper


def main() -> None:
    args = arguments(__doc__, threads=2)
    calls: dict[str, dict[str, list[float]]] = {"plain": defaultdict(list), "adaptive": defaultdict(list)}
    with tiny_target(args.threads) as (target, tokenized):
        prompts = [tokens for _, tokens in tokenized]
        SpeculativeDecoder(target, PromptLookupDrafter()).generate(prompts[0], 16, ignore_eog=True)  # warm up
        real_pass = target.forward_proposal
        for rep in range(args.repeats):
            for tokens in prompts:
                for arm in ("plain", "adaptive") if rep % 2 == 0 else ("adaptive", "plain"):
                    mine = calls[arm]
                    decoder = SpeculativeDecoder(target, None if arm == "plain" else PromptLookupDrafter())
                    _Round.consulted = False
                    target.forward_proposal = _timed("target pass", real_pass, mine, _Round)  # type: ignore[method-assign]
                    if arm == "adaptive":
                        for owner, names in STEPS.items():
                            obj = decoder.schedule if owner == "schedule" else decoder.drafter
                            for name in names:
                                setattr(obj, name, _timed(f"{owner}.{name}", getattr(obj, name), mine, _Round))
                    try:
                        decoder.generate(tokens, args.n, ignore_eog=True)
                    finally:
                        del target.forward_proposal  # (the class's method again)
    print(f"tiny F32 pair, {args.threads} thread(s), {args.n} tokens, open prompts, {args.repeats} repeats: "
          "microseconds per call, median / mean (calls)")
    for arm, steps in calls.items():
        for name, times in sorted(steps.items()):
            print(f"  {arm:9s} {name:36s} {statistics.median(times):8.2f} / {statistics.mean(times):8.2f}  ({len(times)})")


if __name__ == "__main__":
    main()
