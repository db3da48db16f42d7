"""Pure numpy sampling: logits -> probabilities, greedy acceptance, Chen et al. rejection sampling.

No engines and no I/O here. Names say whose distribution a vector is:
``target_probs`` is p (the target's), ``draft_probs`` is q (the drafter's).
Every random draw takes an explicit ``numpy.random.Generator`` so seeded runs repeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .engine import ConfigError, SpecDecError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen; ``temperature == 0`` is greedy.

    Filters apply in this order to the temperature-scaled logits: top-k, top-p, min-p.
    0 disables top-k, 1.0 disables top-p, 0.0 disables min-p.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ConfigError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k!r} must be an integer >= 0 (0 disables it)")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p={self.top_p!r} must lie in (0, 1]")
        if not (isinstance(self.min_p, (int, float)) and 0.0 <= self.min_p < 1.0):
            raise ConfigError(f"min_p={self.min_p!r} must lie in [0, 1)")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigError(f"seed={self.seed!r} must be a non-negative integer or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rng(self) -> np.random.Generator:
        """A generator seeded from ``seed`` (fresh entropy when seed is None)."""
        return np.random.default_rng(self.seed)


def _top_p_keep(scaled: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest set of tokens whose probability mass reaches ``top_p``.

    Partial sorts: look at the best 64 candidates, then 512, ..., not the whole vocabulary.
    """
    finite = np.flatnonzero(np.isfinite(scaled))
    values = scaled[finite]
    probs = np.exp(values - values.max())
    probs /= probs.sum()
    m = 64
    while True:
        m = min(m, len(probs))
        top = np.argpartition(-probs, m - 1)[:m] if m < len(probs) else np.arange(len(probs))
        top = top[np.argsort(-probs[top], kind="stable")]
        cum = np.cumsum(probs[top])
        if cum[-1] >= top_p or m == len(probs):
            cut = int(np.searchsorted(cum, top_p, side="left")) + 1
            return finite[top[: min(cut, m)]]
        m *= 8


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """One logits row ``[V]`` -> a probability vector ``[V]`` (float64) under ``params``.

    Greedy params give the one-hot vector of the argmax.
    """
    n_vocab = logits.shape[-1]
    if params.greedy:
        out = np.zeros(n_vocab, dtype=np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out
    scaled = logits.astype(np.float64) / params.temperature  # [V]
    if 0 < params.top_k < n_vocab:
        keep = np.argpartition(-scaled, params.top_k - 1)[: params.top_k]
        masked = np.full(n_vocab, -np.inf)
        masked[keep] = scaled[keep]
        scaled = masked
    if params.top_p < 1.0:
        keep = _top_p_keep(scaled, params.top_p)
        masked = np.full(n_vocab, -np.inf)
        masked[keep] = scaled[keep]
        scaled = masked
    probs = np.exp(scaled - scaled.max())
    if params.min_p > 0.0:
        probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (possibly unnormalized) probability vector."""
    cum = np.cumsum(probs)
    idx = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return min(idx, len(probs) - 1)


def residual_probs(target_probs: np.ndarray, draft_row: np.ndarray | None, token: int) -> np.ndarray:
    """norm(max(0, p - q)): where to draw the correction token after rejecting ``token``.

    ``draft_row`` None means a deterministic drafter (q one-hot at ``token``).
    """
    if draft_row is None:
        residual = target_probs.copy()
        residual[token] = 0.0
    else:
        residual = np.maximum(target_probs - draft_row, 0.0)
    total = residual.sum()
    if total <= 0.0:
        # Only reachable when p == q up to rounding, where rejection has probability ~0.
        return target_probs
    return residual / total


def greedy_accept(draft_tokens: Sequence[int], target_argmax: np.ndarray) -> tuple[int, int]:
    """Accept drafted tokens while they equal the target's argmax.

    Returns ``(n_accepted, next_token)``: next_token is the correction token (the
    target's argmax at the first mismatch) or the bonus token when all matched.
    """
    k = len(draft_tokens)
    if k:
        mismatch = np.flatnonzero(np.asarray(draft_tokens) != target_argmax[:k])
        n_accepted = int(mismatch[0]) if len(mismatch) else k
    else:
        n_accepted = 0
    return n_accepted, int(target_argmax[n_accepted])


def rejection_sample(
    draft_tokens: Sequence[int],
    draft_probs: np.ndarray | None,
    target_logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Chen et al. (2023) speculative sampling over a linear proposal.

    ``target_logits`` is ``[k + 1, V]``; ``draft_probs`` is None (one-hot q), ``[k, V]``
    or q(x) per token ``[k]``. Accept token x with probability min(1, p(x)/q(x)); at the
    first rejection draw from norm(max(0, p - q)); if all are accepted draw the bonus
    token from p. Stops computing at the first rejection.
    """
    for i, token in enumerate(draft_tokens):
        target_probs = probs_from_logits(target_logits[i], params)  # [V]
        draft_row = draft_probs[i] if draft_probs is not None and draft_probs.ndim == 2 else None
        if draft_row is not None:
            q_x = float(draft_row[token])
        elif draft_probs is not None:
            q_x = float(draft_probs[i])
        else:
            q_x = 1.0
        if rng.random() * q_x < target_probs[token]:
            continue
        if draft_row is None and draft_probs is not None and q_x < 1.0:
            raise SpecDecError(
                "the drafter gave q(x) without full draft rows; the residual needs the full rows"
            )
        return i, sample(residual_probs(target_probs, draft_row, token), rng)
    k = len(draft_tokens)
    return k, sample(probs_from_logits(target_logits[k], params), rng)
