"""Helpers for the exact-distribution tests: the enumerated reference, the chi-square test, and a
fake clock that makes the adaptive schedule's choices deterministic."""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
from scipy.stats import chi2

from specdec_gguf import SamplingParams
from specdec_gguf.engine import EngineBase
from specdec_gguf.engines import InMemoryEngine
from specdec_gguf.sampling import probs_from_logits


def target_joint(target: InMemoryEngine, prompt: Sequence[int], params: SamplingParams, n_out: int) -> np.ndarray:
    """The target's own distribution of its first ``n_out`` sampled tokens, ``[V] * n_out``, by enumeration."""
    vocab = target.n_vocab
    joint = np.zeros((vocab,) * n_out)
    for prefix in itertools.product(range(vocab), repeat=n_out - 1):
        mass, context = 1.0, list(prompt)
        for token in prefix:
            mass *= float(probs_from_logits(target.logits_for(context), params)[token])
            context.append(token)
        if mass > 0:
            joint[prefix] = mass * probs_from_logits(target.logits_for(context), params)
    return joint


def chi_square_p_value(counts: np.ndarray, reference: np.ndarray) -> float:
    """Pearson's chi-square p-value of ``counts`` against the exact ``reference``.

    A sample in a cell the target can never produce gives 0. Cells expected fewer than
    5 times are pooled into one, as the chi-square approximation needs.
    """
    expected = reference * counts.sum()
    if counts[expected == 0].sum() > 0:
        return 0.0
    big, rare = expected >= 5, (expected > 0) & (expected < 5)
    observed = np.append(counts[big], counts[rare].sum())
    wanted = np.append(expected[big], expected[rare].sum())
    keep = wanted > 0
    stat = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    return float(chi2.sf(stat, df=int(keep.sum()) - 1))


def allowed_tokens(logits: np.ndarray, params: SamplingParams) -> set[int]:
    """The filters by their textbook definitions, in float64, independent of sampling.py."""
    z = np.asarray(logits, dtype=np.float64) / params.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = list(np.argsort(-probs, kind="stable"))
    if params.top_k:
        order = order[: params.top_k]
    kept = probs[order] / probs[order].sum()
    if params.top_p < 1.0:
        order = order[: int(np.searchsorted(np.cumsum(kept), params.top_p - 1e-9)) + 1]
        kept = probs[order] / probs[order].sum()
    return {int(t) for t, pr in zip(order, kept) if pr >= params.min_p * kept.max()}


class FakeClock:
    """A clock (``SpeculativeDecoder(clock=...)``) that moves only when an engine is charged for a pass,
    so the adaptive schedule's choices are deterministic."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostedEngine(EngineBase):
    """An InMemoryEngine whose passes cost ``per_pass + per_token * n`` seconds of a fake clock."""

    def __init__(self, inner: InMemoryEngine, clock: FakeClock, *, per_pass: float, per_token: float) -> None:
        self.inner, self.clock, self.per_pass, self.per_token = inner, clock, per_pass, per_token
        self.n_ctx, self.n_vocab = inner.n_ctx, inner.n_vocab

    @property
    def n_past(self) -> int:
        return self.inner.n_past

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.inner.tokens

    def reset(self, n_past: int) -> None:
        self.inner.reset(n_past)

    def _charge(self, n: int) -> None:
        self.clock.now += self.per_pass + self.per_token * n

    def advance(self, tokens) -> None:
        self._charge(len(tokens))
        self.inner.advance(tokens)

    def forward_logits(self, tokens) -> np.ndarray:
        self._charge(len(tokens))
        return self.inner.forward_logits(tokens)

    def forward_argmax(self, tokens) -> np.ndarray:
        self._charge(len(tokens))
        return self.inner.forward_argmax(tokens)
