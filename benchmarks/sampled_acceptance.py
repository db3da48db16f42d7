"""What a sampled draft's acceptance depends on: per token, per answer, or on the tokens before it.

Usage:
  python benchmarks/sampled_acceptance.py TARGET.gguf DRAFT.gguf [--temp 0.8] [-n 96] [--seeds 1,2] [-t 2]

For each prompt of the default set and each seed, the target samples an answer (plain decoding, ``-n``
tokens); both models then read prompt and answer in one pass (teacher-forced), and every answer position
gives the chance that speculative sampling accepts the draft's token there, averaged over the draft's
draws: ``sum_x min(p(x), q(x))`` (1 minus the total variation between the two rows). Printed:
- the mean chance and its variance over positions;
- per answer, its mean (first and second half): how much of the variance lies between answers, which an
  estimate kept per answer could learn and one pooled over answers could not;
- how well an exponentially weighted mean of the chances so far predicts the next (half-lives 4 to 64
  tokens), as the share of the variance it explains against the pooled mean (below 0: worse than it);
- how much the draft's own bucket of the drawn token's q(x), of its row's largest q, and of the previous
  row's largest q explain (weighted by q(x): what a drafter can see before or while drawing).
No timing: run it beside anything. A schedule gains from a faster-moving estimate of a pair's acceptance
only where the second and third say there is something to follow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_gguf.decoder import SpeculativeDecoder  # noqa: E402
from specdec_gguf.drafters.autoregressive import _prob_bucket  # noqa: E402
from specdec_gguf.engines.llama_cpp import LlamaCppEngine  # noqa: E402
from specdec_gguf.prompts import PROMPT_SETS  # noqa: E402
from specdec_gguf.sampling import SamplingParams, probs_from_logits  # noqa: E402


def answer_chances(target: LlamaCppEngine, draft: LlamaCppEngine, prompt: list[int], n: int,
                   params: SamplingParams) -> tuple[np.ndarray, list[tuple[int, int, int, float, float]]]:
    """The chance of acceptance at each answer position, and per position and drawable token x
    (bucket of q(x), bucket of max q, bucket of the previous row's max q or -1, q(x), min(1, p(x)/q(x)))."""
    answer = SpeculativeDecoder(target).generate(prompt, n, params, ignore_eog=True).tokens
    sequence = prompt + list(answer)
    target.reset(0)
    draft.reset(0)
    target_rows = np.array(target.forward_logits(sequence), copy=True)
    draft_rows = np.array(draft.forward_logits(sequence), copy=True)
    chances, per_token, previous = [], [], -1
    for i in range(len(prompt) - 1, len(sequence) - 1):
        p, q = probs_from_logits(target_rows[i], params), probs_from_logits(draft_rows[i], params)
        chances.append(float(np.minimum(p, q).sum()))
        ratio = np.minimum(1.0, np.divide(p, q, out=np.ones_like(p), where=q > 0))
        top = _prob_bucket(float(q.max()))
        for x in np.nonzero(q > 1e-6)[0]:
            per_token.append((_prob_bucket(float(q[x])), top, previous, float(q[x]), float(ratio[x])))
        previous = top
    return np.array(chances), per_token


def explained_by_buckets(rows: np.ndarray, column: int) -> float:
    """Share of the q(x)-weighted variance of min(1, p/q) that the bucket in ``column`` explains."""
    weight, value = rows[:, 3] / rows[:, 3].sum(), rows[:, 4]
    mean = float((weight * value).sum())
    total = float((weight * (value - mean) ** 2).sum())
    left = 0.0
    for bucket in np.unique(rows[:, column]):
        mask = rows[:, column] == bucket
        bucket_mean = (weight[mask] * value[mask]).sum() / weight[mask].sum()
        left += float((weight[mask] * (value[mask] - bucket_mean) ** 2).sum())
    return 1.0 - left / total if total > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--temp", type=float, default=0.8)
    parser.add_argument("-n", type=int, default=96)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("-t", "--threads", type=int, default=2)
    args = parser.parse_args()
    answers, tokens = [], []
    with LlamaCppEngine(args.target, n_ctx=2048, n_threads=args.threads) as target, \
            LlamaCppEngine(args.draft, n_ctx=2048, n_threads=args.threads) as draft:
        for seed in (int(s) for s in args.seeds.split(",")):
            params = SamplingParams(temperature=args.temp, seed=seed)
            for pid, _, text in PROMPT_SETS["default"]:
                chances, per_token = answer_chances(target, draft, target.tokenize(text), args.n, params)
                answers.append((pid, seed, chances))
                tokens += per_token
    every = np.concatenate([c for _, _, c in answers])
    mean, variance = float(every.mean()), float(every.var())
    print(f"{args.target.name} / {args.draft.name}, T = {args.temp}, {len(answers)} answers of {args.n} tokens: "
          f"mean chance {mean:.3f}, variance {variance:.4f}")
    for pid, seed, chances in answers:
        half = len(chances) // 2
        print(f"  {pid:14s} seed {seed}: {chances.mean():.3f} (halves {chances[:half].mean():.3f} / "
              f"{chances[half:].mean():.3f})")
    between = float(np.var([c.mean() for _, _, c in answers]))
    print(f"between answers: {between / variance:.3f} of the variance")
    for half_life in (4, 8, 16, 32, 64):
        alpha = 1.0 - 0.5 ** (1.0 / half_life)
        error = 0.0
        for _, _, chances in answers:
            estimate = mean
            for chance in chances:
                error += (chance - estimate) ** 2
                estimate += alpha * (chance - estimate)
        print(f"a running mean with half-life {half_life:2d} tokens explains {1.0 - error / (variance * len(every)):+.3f}")
    rows = np.array(tokens)
    for name, column in (("bucket of q(x)", 0), ("bucket of max q", 1), ("previous row's max q bucket", 2)):
        print(f"{name:28s} explains {explained_by_buckets(rows, column):.3f} of min(1, p/q)'s variance")


if __name__ == "__main__":
    main()
