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

from .errors import ConfigError, EngineError, SpecDecError

# Temperatures below this sample as greedy. The sampler scales logits by 1/T in float32; below about
# 3e-39 that factor overflows to inf (and logits * inf to NaN). Between exactly tied logits sampling
# would pick either; everywhere else a temperature this small already gives the argmax probability 1.
GREEDY_BELOW = 1e-30


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen; ``temperature == 0`` is greedy (so is any T below ``GREEDY_BELOW``, 1e-30).

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
        return self.temperature < GREEDY_BELOW

    def rng(self) -> np.random.Generator:
        """A generator seeded from ``seed`` (fresh entropy when seed is None)."""
        return np.random.default_rng(self.seed)


def _softmax(values: np.ndarray) -> np.ndarray:
    """Softmax in place over a float32 vector whose maximum is 0 (the caller owns ``values``)."""
    np.exp(values, out=values)
    values /= values.sum()
    return values


def _finite_max(logits: np.ndarray) -> float:
    """The largest logit; EngineError if the row holds NaN or +inf, or nothing but -inf.

    NaN propagates through ``max``, so this costs no pass beyond the one the softmax needs.
    """
    top = float(logits.max())
    if not math.isfinite(top):
        raise EngineError(f"the model produced non-finite logits (max {top}); its weights or the backend are broken")
    return top


def _top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values (unordered), without partitioning the whole vocabulary.

    A threshold from a strided sample of the vector keeps only a few candidates; if fewer
    than k pass it, fall back to a full partial sort. Either way the result is exact.
    """
    n = len(values)
    if n > 16384 and k < n // 64:
        sample = values[:: n // 4096]
        rank = min(len(sample) - 1, 4 * k * len(sample) // n + 8)  # a safe margin below the k-th
        threshold = np.partition(sample, len(sample) - 1 - rank)[len(sample) - 1 - rank]
        candidates = np.flatnonzero(values >= threshold)
        if len(candidates) >= k:
            best = np.argpartition(values[candidates], len(candidates) - k)[len(candidates) - k:]
            return candidates[best]
    return np.argpartition(values, n - k)[n - k:]


def _top_p_cut(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Positions in ``probs`` of the smallest set whose mass reaches ``top_p``, best first.

    Sorts only the tokens above a probability threshold, lowering it until they hold
    enough mass, instead of sorting the whole vocabulary.
    """
    threshold = float(probs.max()) * 1e-3
    while True:
        candidates = np.flatnonzero(probs >= threshold)
        # `not threshold >= 1e-30` also ends the loop when NaN probabilities made the threshold NaN.
        if probs[candidates].sum(dtype=np.float64) >= top_p or not threshold >= 1e-30 \
                or len(candidates) == len(probs):
            order = candidates[np.argsort(-probs[candidates], kind="stable")]
            cum = np.cumsum(probs[order], dtype=np.float64)
            return order[: min(int(np.searchsorted(cum, top_p, side="left")) + 1, len(order))]
        threshold *= 1e-2


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """One logits row ``[V]`` -> a probability vector ``[V]`` (float32) under ``params``.

    Greedy params give the one-hot vector of the argmax. Filters work on the candidate
    set only (top-k by a partial sort), and the softmax runs in float32 over what is left.
    """
    n_vocab = logits.shape[-1]
    if params.greedy:
        best = int(np.argmax(logits))
        _finite_max(logits[best:best + 1])  # NaN and +inf win argmax, so the pick shows them
        out = np.zeros(n_vocab, dtype=np.float32)
        out[best] = 1.0
        return out
    top = _finite_max(logits)
    # Shift before scaling: (logits - max) / T lies in [-inf, 0], so no temperature overflows it.
    scaled = np.subtract(logits, np.float32(top), dtype=np.float32)  # [V], a copy
    with np.errstate(over="ignore"):  # a tiny T sends far-below-max logits to -inf: probability 0, as meant
        scaled *= np.float32(1.0 / params.temperature)
    ids: np.ndarray | None = None  # candidate token ids; None = the whole vocabulary
    if 0 < params.top_k < n_vocab:
        ids = _top_indices(scaled, params.top_k)  # [top_k]
        probs = _softmax(scaled[ids])
    else:
        probs = _softmax(scaled)
    if params.top_p < 1.0:
        keep = _top_p_cut(probs, params.top_p)
        ids = keep if ids is None else ids[keep]
        probs = probs[keep]
        probs /= probs.sum()
    if params.min_p > 0.0:
        keep = np.flatnonzero(probs >= params.min_p * probs.max())
        if len(keep) < len(probs):
            ids = keep if ids is None else ids[keep]
            probs = probs[keep]
            probs /= probs.sum()
    if ids is None:
        return probs
    out = np.zeros(n_vocab, dtype=np.float32)
    out[ids] = probs
    return out


_SAMPLE_BLOCK = 1024


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (possibly unnormalized) probability vector.

    Large vocabularies go in two steps (block sums, then one block), so no float64
    cumulative sum over the whole vocabulary is built.
    """
    n = len(probs)
    u = rng.random()
    if n <= 4 * _SAMPLE_BLOCK:
        cum = np.cumsum(probs, dtype=np.float64)
        return min(int(np.searchsorted(cum, u * cum[-1], side="right")), n - 1)
    block_cum = np.cumsum(np.add.reduceat(probs, np.arange(0, n, _SAMPLE_BLOCK), dtype=np.float64))
    target = u * block_cum[-1]
    b = min(int(np.searchsorted(block_cum, target, side="right")), len(block_cum) - 1)
    start = b * _SAMPLE_BLOCK
    inner = np.cumsum(probs[start:start + _SAMPLE_BLOCK], dtype=np.float64)
    rest = target - (block_cum[b - 1] if b else 0.0)
    i = int(np.searchsorted(inner, rest, side="right"))
    if i >= len(inner):  # rounding between the two sums: the block's last possible token
        i = int(np.flatnonzero(probs[start:start + _SAMPLE_BLOCK])[-1])
    return start + i


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


def sample_declined(token: int, draft_q: np.ndarray | float | None, target_logits: np.ndarray,
                    params: SamplingParams, rng: np.random.Generator) -> tuple[int, float]:
    """A plain step's token, drawn from p as ``rejection_sample`` draws it with nothing proposed, and the
    chance min(1, p(x)/q(x)) that speculative sampling would have accepted ``token``, a drafted token
    nobody verified (``draft_q``: its q row ``[V]``, q(x) itself, or None for a deterministic
    drafter, q(x) = 1). The chance is free evidence of how right the draft is: the schedule learns from
    it as greedy decoding learns from whether the declined token matched. For a deterministic drafter's
    token (the decoder's use): a token a drafter drew at random goes to ``verify_declined``."""
    target_probs = probs_from_logits(target_logits, params)  # [V]
    q_x = 1.0 if draft_q is None else _q_of(token, draft_q)
    return sample(target_probs, rng), _acceptance_chance(float(target_probs[token]), q_x)


# Why a rejection needs q's row: the residual norm(max(0, p - q)) is over the whole vocabulary.
NEEDS_ROWS = "the drafter gave q(x) without full draft rows; the residual needs the full rows"


def _q_of(token: int, draft_q: np.ndarray | float) -> float:
    """q(x) from a q row ``[V]`` or q(x) itself."""
    return float(draft_q[token]) if np.ndim(draft_q) == 1 else float(draft_q)  # type: ignore[index,arg-type]


def _acceptance_chance(p_x: float, q_x: float) -> float:
    """min(1, p(x)/q(x)), as rejection_sample decides: accepted when u·q(x) < p(x), u uniform in [0, 1)."""
    return 0.0 if p_x <= 0.0 else 1.0 if p_x >= q_x else p_x / q_x


def verify_declined(token: int, draft_row: np.ndarray, target_logits: np.ndarray, params: SamplingParams,
                    rng: np.random.Generator) -> tuple[int, float]:
    """A plain step's token where a drafter *drew* ``token`` (``draft_row``: its q row ``[V]``, or q(x)
    alone) and the schedule declined to verify it: speculative sampling's test of ``token`` against
    the plain step's own row (accepted with chance min(1, p(x)/q(x)), else a draw from
    norm(max(0, p - q))), and that chance. Drawing from p instead would be exact only if declining
    were settled before the draw; a schedule declines *because* of the drawn token's confidence,
    and verifying it here, at no extra cost, keeps the output exact whatever it decides."""
    target_probs = probs_from_logits(target_logits, params)  # [V]
    q_x, p_x = _q_of(token, draft_row), float(target_probs[token])
    chance = _acceptance_chance(p_x, q_x)
    if rng.random() * q_x < p_x:
        return token, chance
    if np.ndim(draft_row) != 1:
        raise SpecDecError(NEEDS_ROWS)
    return sample(residual_probs(target_probs, draft_row, token), rng), chance


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
    *,
    refused_row: np.ndarray | None = None,
    chances: list[float] | None = None,
) -> tuple[int, int]:
    """Chen et al. (2023) speculative sampling over a linear proposal.

    ``target_logits`` is ``[k + 1, V]``; ``draft_probs`` is None (one-hot q), ``[k, V]``
    or q(x) per token ``[k]``. Accept token x with probability min(1, p(x)/q(x)); at the
    first rejection draw from norm(max(0, p - q)); if all are accepted draw the bonus
    token from p. Stops computing at the first rejection. ``refused_row``: the q row of a drawn
    token after the proposal that the target gives probability 0 (an id outside its
    vocabulary): it would be rejected for sure, so after all are accepted the next token comes
    from norm(max(0, p - q)) with that row instead. ``chances``: a list that gets each examined
    token's chance of acceptance min(1, p(x)/q(x)), up to and including the first rejected one
    (what an adaptive schedule learns from: the same outcomes as accepted/rejected, less noisy).
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
        p_x = float(target_probs[token])
        if chances is not None:
            chances.append(_acceptance_chance(p_x, q_x))
        if rng.random() * q_x < p_x:
            continue
        if draft_row is None and draft_probs is not None and q_x < 1.0:
            raise SpecDecError(NEEDS_ROWS)
        return i, sample(residual_probs(target_probs, draft_row, token), rng)
    k = len(draft_tokens)
    target_probs = probs_from_logits(target_logits[k], params)
    if refused_row is not None:
        return k, sample(residual_probs(target_probs, refused_row, -1), rng)
    return k, sample(target_probs, rng)
