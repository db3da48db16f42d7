"""Calibrated acceptance: the chance a drafted token is accepted, learned online per feature bucket.

A drafter labels each token it proposes with a *bucket* — what it knew before verifying
(prompt lookup: how long the matched context is; a draft model: its own probability of
the token) — and gives a prior acceptance per bucket. The estimate is conditional: the
chance of acceptance given every earlier token of the proposal was accepted.

Two layers learn from every verified token (the first ``accepted`` were accepted, the
next one was rejected; tokens after a rejection tell nothing):

1. a pooled calibration of the drafter's priors, ``σ(a + s·logit(prior))``, fitted to all
   buckets' outcomes at once, so evidence from a few buckets moves them all (a copy task
   seen in long matches makes shorter matches believable too);
2. Beta counts per bucket around that pooled estimate, so each bucket ends up following
   its own outcomes.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .errors import ConfigError

_REFIT_EVERY = 4  # updates between refits of the pooled calibration (a refit costs ~50 µs)


class AcceptanceModel:
    """Calibrated acceptance per bucket; ``confidence(bucket)`` is its posterior mean.

    ``priors[i]`` is bucket i's prior mean; ``strength`` is how many observations the
    (pooled) prior is worth in a bucket; ``recency`` caps a bucket's count so estimates keep
    following a drafter whose accuracy drifts (a copy ends, a topic changes).
    """

    def __init__(self, priors: Sequence[float], strength: float = 3.0, recency: float = 64.0) -> None:
        if not len(priors):
            raise ConfigError("an acceptance model needs at least one bucket prior")
        if any(not 0.0 < p < 1.0 for p in priors):
            raise ConfigError(f"bucket priors must lie in (0, 1); got {list(priors)}")
        if strength <= 0 or recency < 1:
            raise ConfigError(f"strength={strength} must be > 0 and recency={recency} >= 1")
        self.strength, self.recency = strength, recency
        prior = np.asarray(priors, dtype=np.float64)
        self._logit = np.log(prior / (1 - prior))
        self._hits = np.zeros(len(prior))
        self._total = np.zeros(len(prior))
        self._unverified_hits = np.zeros(len(prior))  # outcomes seen without verifying (calibration only)
        self._unverified_total = np.zeros(len(prior))
        self._pooled = prior.copy()
        self._mean = prior.tolist()
        self.calibration = (0.0, 1.0)  # (a, s): pooled prior = σ(a + s·logit(prior))
        self.observations = [0] * len(prior)
        self._since_fit = 0

    def __len__(self) -> int:
        return len(self._mean)

    def confidence(self, bucket: int) -> float:
        """Posterior mean acceptance of a token in ``bucket`` (given the tokens before it were accepted)."""
        return self._mean[bucket]

    def update(self, buckets: Sequence[int], accepted: int) -> None:
        """Verified tokens with these buckets: the first ``accepted`` were accepted, the next rejected."""
        hits, total = self._hits, self._total
        for i, b in enumerate(buckets[: accepted + 1]):
            self._count(hits, total, b, i < accepted)
            self.observations[b] += 1
            self._mean[b] = (hits[b] + self.strength * self._pooled[b]) / (total[b] + self.strength)
        self._counted()

    def update_calibration(self, bucket: int, accepted: bool) -> None:
        """An outcome seen without verifying (a declined greedy proposal's first token against the
        token the plain step produced): it moves the pooled calibration, not the bucket's own count."""
        self._count(self._unverified_hits, self._unverified_total, bucket, accepted)
        self._counted()

    def _count(self, hits: np.ndarray, total: np.ndarray, bucket: int, hit: bool) -> None:
        if total[bucket] >= self.recency:  # forget a little: keep following recent outcomes
            scale = (self.recency - 1.0) / total[bucket]
            hits[bucket] *= scale
            total[bucket] *= scale
        hits[bucket] += 1.0 if hit else 0.0
        total[bucket] += 1.0

    def _counted(self) -> None:
        self._since_fit += 1
        if self._since_fit >= _REFIT_EVERY:
            self._refit()

    def _refit(self) -> None:
        """Fit (a, s) by a few Newton steps on all buckets' counts, with a Gaussian prior at (0, 1)."""
        self._since_fit = 0
        hits, total = self._hits + self._unverified_hits, self._total + self._unverified_total
        seen = total > 0
        x, y, n = self._logit[seen], hits[seen], total[seen]
        a, s = self.calibration
        prior_var = np.array([1.0, 0.25])  # how far the data may move a and s
        for _ in range(4):
            p = 1.0 / (1.0 + np.exp(-(a + s * x)))
            r = y - n * p
            w = n * p * (1 - p)
            grad = np.array([r.sum() - a / prior_var[0], (r * x).sum() - (s - 1.0) / prior_var[1]])
            hess = np.array([[w.sum() + 1 / prior_var[0], (w * x).sum()],
                             [(w * x).sum(), (w * x * x).sum() + 1 / prior_var[1]]])
            step = np.linalg.solve(hess, grad)
            a, s = a + step[0], s + step[1]
        s = max(s, 0.1)  # the prior's order must stay: a surer bucket never becomes a less sure one
        self.calibration = (float(a), float(s))
        self._pooled = 1.0 / (1.0 + np.exp(-(a + s * self._logit)))
        self._mean = ((self._hits + self.strength * self._pooled) / (self._total + self.strength)).tolist()
