"""One run, round by round: what the adaptive schedule saw and decided, simulated (no timing noise) or real.

Usage:
  python benchmarks/round_log.py TRACE_ID [--traces FILE.jsonl] [--curve NAME[=...]] [-n 64]
                                [--drafter draft-model --draft-ratio 0.12 [--draft-overhead 0.1]] [--in-turn | --remembered]
                                [--variant NAME:field=v,...]
  python benchmarks/round_log.py PROMPT_ID --model T.gguf [--draft D.gguf] [--set default | --prompts P.jsonl] [-n 64] [-t 2]
                                [--runs 3] [--fresh-cache] [--exact] [--temp 0.8 --seed 0] [--variant ...]

Each round prints what a costly drafter's start decision said (``next_k``: its start value and
whether the round drafts; rounds it runs plain print nothing, a guard's pause one line), the proposal (length, the verify cap, the first buckets and their
calibrated confidences, how many tokens ``choose`` verifies, and where it verifies fewer so that a second
pass takes the rest, what one pass would have) and the outcome (verified, accepted,
whether a declined proposal's first token was right), with the pooled calibration and, for a
remembered one, the evidence for it. Then the run's ratio to plain decoding and to fixed k.
``--in-turn``: the run starts from what the traces' runs in turn left in the calibration store
(one whole turn, then the traces before this one: simulation.in_turn's order), as ``policy_sim.py
--in-turn`` runs it; ``--remembered``: from what the other traces' cold runs left (simulation.remembered), as
``policy_sim.py --remembered`` (judge.py's "remembered" rows) runs it. The question it answers is why a run in
``policy_sim.py``'s table lost.

With ``--model`` the runs are real: a built-in prompt (``--set``) on the model, with the ``--draft`` model
or prompt lookup, ``--runs`` times a plain run then an adaptive one, each a fresh decoder whose engines
prefill the prompt (as ``specdec bench`` runs trials), the adaptive one logged with each round's measured
draft and verify times, and its ratio to the plain run beside it. They read and write the user cache
(cost profiles, calibrations) as ``specdec run`` does; ``--fresh-cache`` gives them an empty one, so the
first run is a first run. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.calibrations import Stored  # noqa: E402
from specdec_gguf.proposal import DraftProposal  # noqa: E402
from specdec_gguf.schedule import AdaptiveSchedule, ScheduleConstants  # noqa: E402
from specdec_gguf.simulation import SimulatedRun, Trace, in_turn, remembered, simulate_run, synthetic_traces  # noqa: E402
from ab_constants import parse_variant, sampling_for  # noqa: E402
from policy_sim import load_traces, parse_curve  # noqa: E402


class RoundLog(AdaptiveSchedule):
    """The adaptive schedule, printing its decisions as it makes them."""

    def plain_rounds(self) -> int:
        guard = self.guard._pause  # (claimed by the call below)
        rounds = super().plain_rounds()
        if rounds:  # (the decoder runs these without asking next_k)
            why = "the guard: drafting lost to plain steps lately" if guard else \
                f"until the next look, {self._rounds_since_draft} plain rounds since the last draft"
            print(f"pause: {rounds} plain rounds ({why})")
        return rounds

    def next_k(self, room: int) -> int:
        k = super().next_k(room)
        if not self.free_drafter and k:
            look = "look" if self._probing else "draft"
            costs = self._cost_table()
            curve = ", ".join(f"{costs[n] / costs[0]:.2f}" for n in (1, 2, 4, 8) if n < len(costs))
            print(f"round: {look} (start value {self._start_value:+.3f}, {self._rounds_since_draft} plain rounds "
                  f"since the last draft; T(1) {costs[0] * 1e3:.1f} ms, T(2, 3, 5, 9) / T(1) {curve})")
        return k

    _one_pass: int | None = None  # what one pass would have verified where choose verified less (two passes)

    def _first_of_two(self, chain: Sequence[tuple[float, float]], costs: Sequence[float], lam: float,
                      entry: float, k: int) -> int:
        j = super()._first_of_two(chain, costs, lam, entry, k)
        self._one_pass = k if j != k else None  # (choose prints it)
        return j

    def choose(self, proposal: DraftProposal, greedy: bool) -> int:
        self._one_pass = None
        k = super().choose(proposal, greedy)
        model = self.models[greedy]
        buckets = list(proposal.buckets or range(len(proposal.tokens)))[:8]
        confidences = " ".join(f"{model.confidence(b, j):.2f}" for j, b in enumerate(buckets))
        split = f" (one pass: {self._one_pass}, the rest next round)" if self._one_pass else ""
        print(f"  proposal of {len(proposal.tokens)}, cap {self._verify_cap}: verify {k}{split}; buckets {buckets} "
              f"confidence {confidences}")
        return k

    def observe(self, proposal: DraftProposal, verified: int, accepted: int, generated: int, greedy: bool,
                draft_seconds: float, verify_seconds: float, first_matched: bool | float | None = None,
                chances: Sequence[float] | None = None) -> None:
        super().observe(proposal, verified, accepted, generated, greedy, draft_seconds, verify_seconds,
                        first_matched=first_matched, chances=chances)
        if not proposal.tokens:
            return
        model = self.models[greedy]
        evidence = "" if model._evidence is None else f", evidence for the remembered one {model._evidence:+.2f}"
        right = "" if first_matched is None else f", first token right: {first_matched}"
        if chances and verified:
            right += f", chances {' '.join(f'{c:.2f}' for c in chances)}"
        print(f"  verified {verified}, accepted {accepted}{right} (draft {draft_seconds * 1e3:.2f} ms, verify "
              f"{verify_seconds * 1e3:.2f} ms); calibration ({', '.join(f'{v:.2f}' for v in model.calibration)})"
              f"{evidence}")


def store_before(traces: list[Trace], target: Trace, run_of) -> Stored:
    """What the store holds when ``target``'s run starts in the second of two turns of the traces run
    in turn (simulation.in_turn, which hands each run the store as it stands)."""
    handed: dict[str, Stored] = {}

    def run(trace: Trace, stored: Stored) -> SimulatedRun:
        handed[trace.id] = stored  # (the second turn's overwrites the first's)
        return run_of(trace, stored)

    in_turn(traces, run)
    return handed[target.id]


def real_runs(args: argparse.Namespace, constants: ScheduleConstants | None) -> None:
    """``args.runs`` times a plain run then a logged adaptive one on the real model (see the module docs)."""
    from specdec_gguf.benchmark import start_afresh
    from specdec_gguf.factory import make_decoder, open_engine
    from specdec_gguf.prompts import chosen_prompts
    from specdec_gguf.settings import DrafterSettings, EngineSettings

    texts = dict(chosen_prompts(args.set, args.prompts))
    source = str(args.prompts) if args.prompts is not None else f"set {args.set!r}"
    if args.trace not in texts:
        raise SystemExit(f"no prompt {args.trace!r} in {source}; there are: {', '.join(texts)}")
    target = open_engine(EngineSettings(model=args.model, n_ctx=2048, n_threads=args.threads, exact=args.exact))
    draft = open_engine(EngineSettings(model=args.draft, n_ctx=2048, n_threads=args.threads)) if args.draft else None
    engines = [e for e in (target, draft) if e is not None]
    kind = "draft-model" if draft is not None else "prompt-lookup"
    prompt = target.tokenize(texts[args.trace])
    sampling = sampling_for(args.temp, args.seed)
    try:
        plain = DrafterSettings(kind="none")
        make_decoder(target, plain).generate(prompt, min(32, args.n), ignore_eog=True)  # (warm llama.cpp up)
        for run in range(args.runs):
            start_afresh(engines)
            base = make_decoder(target, plain).generate(prompt, args.n, sampling, ignore_eog=True).stats.generation_seconds
            decoder = make_decoder(target, DrafterSettings(kind=kind), draft, constants=constants)  # type: ignore[arg-type]
            decoder.schedule.__class__ = RoundLog  # (the schedule the decoder built, logging; nothing else changes)
            print(f"run {run + 1}, {kind}:")
            start_afresh(engines)
            seconds = decoder.generate(prompt, args.n, sampling, ignore_eog=True).stats.generation_seconds
            print(f"run {run + 1}: adaptive {seconds * 1e3:.1f} ms, plain {base * 1e3:.1f} ms: {base / seconds:.3f}x plain")
    finally:
        for engine in engines:
            engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="the trace's id (as policy_sim.py prints it), or with --model a prompt id")
    parser.add_argument("--model", type=Path, help="run on this target GGUF instead of simulating")
    parser.add_argument("--draft", type=Path, help="with --model: the draft GGUF (without: prompt lookup)")
    prompts = parser.add_mutually_exclusive_group()
    prompts.add_argument("--set", default="default", help="with --model: the built-in prompt set")
    prompts.add_argument("--prompts", type=Path, help="with --model: a JSONL file of prompts (id, text) instead of --set")
    parser.add_argument("-t", "--threads", type=int, default=2, help="with --model: CPU threads")
    parser.add_argument("--exact", action="store_true", help="with --model: the target in exact mode (docs/exactness.md)")
    parser.add_argument("--runs", type=int, default=3, help="with --model: plain and adaptive runs, in turn")
    parser.add_argument("--fresh-cache", action="store_true", help="with --model: start from an empty user cache")
    parser.add_argument("--temp", type=float, default=0.0, help="with --model: sample at this temperature (0: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="with --model and --temp: every run samples with this seed")
    parser.add_argument("--traces", type=Path, help="recorded traces (JSONL; without: the synthetic ones)")
    parser.add_argument("--curve", default="big-q8", help="a name of simulation.CURVES or NAME=T1_MS:R2,...")
    parser.add_argument("-n", type=int, default=64, help="answer length")
    parser.add_argument("--drafter", choices=["prompt-lookup", "draft-model"], default="prompt-lookup")
    parser.add_argument("--draft-style", choices=["informative", "underconfident"], default="informative")
    parser.add_argument("--draft-ratio", type=float, default=0.1)
    parser.add_argument("--draft-overhead", type=float, default=0.0,
                        help="what each draft proposal costs besides, over a target step (policy_sim.py's)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--in-turn", action="store_true")
    start.add_argument("--remembered", action="store_true",
                       help="start from what the other traces' cold runs left (policy_sim.py --remembered)")
    parser.add_argument("--variant", help="NAME:field=value,... (the schedule's constants)")
    args = parser.parse_args()
    constants: ScheduleConstants | None = parse_variant(args.variant)[1] if args.variant else None
    if args.model:
        if args.fresh_cache:
            with tempfile.TemporaryDirectory(prefix="specdec-round-log-") as cache:
                os.environ["SPECDEC_CACHE_DIR"] = cache
                real_runs(args, constants)
        else:
            real_runs(args, constants)
        return
    curve = parse_curve(args.curve)
    traces = load_traces(args.traces) if args.traces else synthetic_traces()
    found = [t for t in traces if t.id == args.trace]
    if not found:
        raise SystemExit(f"no trace {args.trace!r}; there are: {', '.join(t.id for t in traces)}")
    trace = found[0]
    options = dict(drafter=args.drafter, draft_style=args.draft_style, draft_ratio=args.draft_ratio,
                   draft_overhead=args.draft_overhead)

    def run_of(t: Trace, stored: Stored, **more) -> SimulatedRun:
        return simulate_run(t, curve, args.n, None, stored=stored, constants=constants, **options, **more)

    stored = Stored()
    if args.in_turn:
        stored = store_before(traces, trace, run_of)
    elif args.remembered:
        stored = Stored(calibrations=remembered([run_of(t, Stored()) for t in traces if t.id != trace.id]))
    print(f"{trace.id} on {curve}, {args.n} tokens, {args.drafter}; stored calibrations: "
          f"{ {g: tuple(round(v, 2) for v in c) for g, c in stored.calibrations.items()} or 'none'}"
          f"{'; record ' + str(stored.record) if stored.record else ''}")
    adaptive = run_of(trace, stored, schedule_type=RoundLog).seconds
    plain = simulate_run(trace, curve, args.n, 0, **options).seconds
    fixed = {k: plain / simulate_run(trace, curve, args.n, k, **options).seconds for k in (1, 2, 4, 8, 16, 32, 64)}
    print(f"adaptive {plain / adaptive:.3f}x plain; fixed k: " + ", ".join(f"{k}: {r:.3f}x" for k, r in fixed.items()))


if __name__ == "__main__":
    main()
